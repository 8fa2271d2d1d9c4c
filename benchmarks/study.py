"""`python -m programs.study` for the papers' study files (benchmarks/studies/).

    python -m benchmarks.study run benchmarks/studies/fedcda.toml   # tune, plan, report too

The same commands, flags and checks as `python -m programs.study` (docs/studies.md); the
writers a file's `report` names in benchmarks/ (`benchmarks.report:write_study_pages`: every
reproduction page, as `python -m benchmarks.report` writes them;
`benchmarks.federations:write_pages`) are lent to it here (`programs.study.LENT_WRITERS`),
since programs never import benchmarks.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from benchmarks import federations  # pylint: disable=g-import-not-at-top
from benchmarks import report  # pylint: disable=g-import-not-at-top
from programs import flag_parsing  # pylint: disable=g-import-not-at-top
from programs import study  # pylint: disable=g-import-not-at-top

# The paper layer's page writers, by the `report` value that names them.
WRITERS = {
    'benchmarks.report:write_study_pages': report.write_study_pages,
    'benchmarks.federations:write_pages': federations.write_pages,
}


def main(argv):
  study.LENT_WRITERS.update(WRITERS)
  return study.main(argv)


if __name__ == '__main__':
  flag_parsing.run(main)
