"""The JSON Schema corpus (installed as gdserve.schemas, data only): the shapes structured-output
users send, and under agents/ what agents' tools and hand-offs ask for. README.md says what each
top-level file exercises; the agents bench draws its schemas from here by default."""
from pathlib import Path

SCHEMA_DIR = Path(__file__).resolve().parent
