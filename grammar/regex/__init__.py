"""Regexes down to byte DFAs: the regex kind's syntax (user regexes made ready for outlines-core,
choice lists), regexes as trees, a regex's byte NFA determinized in C (whole, or on demand as
matchers reach its states), and byte DFAs put together without determinizing again."""
