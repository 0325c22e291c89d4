"""The one error type of gdserve.grammar: a constraint that cannot be compiled or is unsupported."""


class GrammarError(ValueError):
    """A constraint spec that cannot be compiled; the message names the offending part.

    The server turns it into HTTP 400.
    """

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __reduce__(self):
        # Picklable across the compile worker pool with its message intact.
        return (type(self), (self.message,))


class RecursiveSchemaError(GrammarError):
    """A JSON Schema no regex can hold: its $refs form a cycle, or (open_objects) undeclared
    members of any depth sit among declared ones (compile_grammar then takes the grammar path,
    json.schema_cfg, and its errors are the schema's)."""


class RegexTooLargeError(GrammarError):
    """A JSON Schema whose regex would take the regex path too long to index (compile_grammar then
    takes the grammar path, where each large subschema is a rule of its own)."""


class UnsatisfiableSchemaError(GrammarError):
    """A JSON Schema that no JSON value satisfies: nothing could ever be generated for it."""
