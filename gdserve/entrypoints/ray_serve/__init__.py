"""Data-parallel engine replicas on Ray Serve behind one OpenAI-compatible ingress
(`gdserve serve --ray --replicas N`, or `serve run` with a config file): docs/replicas.md."""
