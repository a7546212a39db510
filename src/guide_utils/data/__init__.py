"""The data layer, above runtime: the data the engines read. The dataset archive format
clusters store (``datasets``; ``imagenet`` writes it from the official ImageNet downloads,
with the validation labels of ``imagenet_labels``) and the PyTorch datasets and loaders:
MNIST-1D, synthetic images, image folders and archives (``loaders``)."""
