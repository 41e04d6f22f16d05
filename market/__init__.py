"""The image and model markets: catalog files, the SQLAlchemy store, model mounts."""
