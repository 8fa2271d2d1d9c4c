"""python -m programs.methods: rewrites docs/methods.md's option table from the registry."""

from programs.methods import option_table

option_table.rewrite_page()
