"""torchvision models as a trainer outside this project would hook them: resnet18 (BatchNorm,
in-place ReLU, float image inputs) and a small VisionTransformer (a class token and a position
embedding no submodule owns), with the stages capsule.torchvision_stages gives. `factory` is what
`python3 -P -m capsule replay FILE --model vision_models:factory` calls.

With config["observe"], the model is watched through module hooks (capsule.Model.observe)
instead. Faults, by config["fault"]: "layer3-grad" doubles the gradient flowing back out of layer3 on the
optimized path only (its forward is exact), so only a backward comparison can see it.

config["loss"] == "clamped": the loss clamps the labels into the model's classes, as a loss that
silently accepts a label outside them does (torch's cross-entropy refuses one)."""
import torch
import torchvision

import capsule


class _DoubleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return 2 * g


def batch(seed=1, n=4, **declared):
    """n random 32x32 images of 10 classes, drawn from `seed`; `declared` adds what the trainer
    declares of its loss ("objective", "ignore_index", ...)."""
    g = torch.Generator().manual_seed(seed)
    return {"inputs": torch.randn(n, 3, 32, 32, generator=g),
            "labels": torch.randint(0, 10, (n,), generator=g), **declared}


def make(config):
    torch.manual_seed(config.get("seed", 0))
    if config["arch"] == "resnet18":
        return torchvision.models.resnet18(num_classes=10)
    net = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                               num_heads=2, hidden_dim=32, mlp_dim=64,
                                               num_classes=10)
    # torchvision starts the head at zero (every logit 0, the loss log 10 whatever the labels):
    # nn.Linear's own draw instead, so that the loss depends on the batch.
    net.heads.head.reset_parameters()
    return net


def loss_of(config):
    """The loss the trainer computes: loss(logits, batch)."""
    if config.get("loss") == "clamped":
        return lambda x, b: torch.nn.functional.cross_entropy(
            x, b["labels"].clamp(0, x.shape[1] - 1))
    return lambda x, b: torch.nn.functional.cross_entropy(x, b["labels"])


def model_of(net, config):
    if config.get("observe"):
        # Watched through module hooks, not described as stages.
        return capsule.Model.observe(
            config["arch"], net,
            lambda m, b: torch.nn.functional.cross_entropy(m(b["inputs"]), b["labels"]),
            config=config)
    stages = capsule.torchvision_stages(net, loss_of(config))
    optimized = list(stages)
    if config.get("fault") == "layer3-grad":
        i = [s[0] for s in stages].index("layer3")
        optimized[i] = ("layer3", lambda m, x, b: _DoubleGrad.apply(m.layer3(x)))
    return capsule.Model(config["arch"], net, optimized, config=config, reference_stages=stages)


def factory(config):
    return model_of(make(config), config)
