"""Studies: methods x settings x seeds, tuned, resumed and compared over paired seeds.

A study file (TOML) declares them; `python -m programs.study` runs, tunes, plans and reports
them. `study.Study` is the declaration; the modules beside it load it from a file, make its
runs and write its page.
"""
