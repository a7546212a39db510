"""Keras models by the PyTorch engine's names: the two small CPU models written out, the
large ones from ``tf.keras.applications``."""

from __future__ import annotations

from ..core.errors import GuideError

KERAS_APPLICATIONS = {"resnet50": "ResNet50", "resnet101": "ResNet101", "resnet152": "ResNet152",
                      "mobilenet_v2": "MobileNetV2", "vgg16": "VGG16"}
SMALL_MODELS = ("small_resnet", "mnist1d_cnn")


def check_model_name(name: str) -> None:
    if name not in (*SMALL_MODELS, *KERAS_APPLICATIONS):
        known = ", ".join([*SMALL_MODELS, *KERAS_APPLICATIONS])
        raise GuideError(f"unknown model {name!r} for TensorFlow; choose from {known}")


def build_keras_model(name: str, *, num_classes: int, input_shape: tuple[int, ...], weight_decay: float):
    """A Keras model by the PyTorch engine's names (channels-last ``input_shape``), with
    weight decay as an L2 penalty on every kernel: ``wd/2 * |w|^2`` gives SGD the same
    ``wd * w`` gradient term that PyTorch's ``weight_decay`` adds."""
    import tensorflow as tf

    check_model_name(name)
    L = tf.keras.layers
    if name == "mnist1d_cnn":
        if len(input_shape) != 2:
            raise GuideError(f"model mnist1d_cnn takes 1-D signals, but the data has shape {tuple(input_shape)}; "
                             "use --data mnist1d, or small_resnet for image data")
        x = inp = L.Input(input_shape)
        for stride in (1, 2, 2):
            x = L.Conv1D(32, 5, stride, padding="same", use_bias=False)(x)
            x = L.ReLU()(L.BatchNormalization()(x))
        model = tf.keras.Model(inp, L.Dense(num_classes)(L.Flatten()(x)), name=name)
    elif len(input_shape) != 3:
        raise GuideError(f"model {name} takes images, but the data has shape {tuple(input_shape)}; "
                         "use mnist1d_cnn for --data mnist1d")
    elif name == "small_resnet":
        def block(x, cout, stride):
            y = L.Conv2D(cout, 3, stride, padding="same", use_bias=False)(x)
            y = L.ReLU()(L.BatchNormalization()(y))
            y = L.BatchNormalization()(L.Conv2D(cout, 3, 1, padding="same", use_bias=False)(y))
            if stride != 1 or x.shape[-1] != cout:
                x = L.BatchNormalization()(L.Conv2D(cout, 1, stride, use_bias=False)(x))
            return L.ReLU()(y + x)

        x = inp = L.Input(input_shape)
        x = L.ReLU()(L.BatchNormalization()(L.Conv2D(16, 3, 1, padding="same", use_bias=False)(x)))
        x = block(block(block(x, 16, 1), 32, 2), 64, 2)
        model = tf.keras.Model(inp, L.Dense(num_classes)(L.GlobalAveragePooling2D()(x)), name=name)
    else:
        app = getattr(tf.keras.applications, KERAS_APPLICATIONS[name])
        model = app(weights=None, input_shape=input_shape, classes=num_classes, classifier_activation=None)
    if weight_decay:
        for w in model.trainable_weights:
            if "kernel" in w.name:
                model.add_loss(lambda w=w: 0.5 * weight_decay * tf.reduce_sum(tf.square(w)))
    return model
