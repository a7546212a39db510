"""The tensorflow layer, above the engine whose plan and bookkeeping it shares: the
TensorFlow door. Keras training under Horovod or MultiWorkerMirroredStrategy with the
PyTorch engine's settings, run plan and run records (``python -m guide_utils.train_tf``).

Nothing here imports TensorFlow until a function needs it.
"""
