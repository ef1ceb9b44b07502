"""The notebook's data (models, ids, index, migrations) and the Flask-free logic that
routes and the worker share (model choice, provider keys, embeddings, context)."""
