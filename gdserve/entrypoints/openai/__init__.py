"""The OpenAI-compatible HTTP server: `build_app(engine, served_model_name, ...)`."""
