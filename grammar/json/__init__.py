"""JSON Schema (kind "json"): schemas normalized and evaluated, compiled to one regex where they
are regular, else to a grammar for cfg/; strings, numbers, formats and object keys written as
regexes (keys also as DFAs), uniqueItems kept by the matcher, and the enforcement report."""
