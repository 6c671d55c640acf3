"""capsule for Python trainers: failure capsules and deterministic replay over capsule's C++ engine.

The package is a thin layer over the C++ libraries (the ``_capsule`` extension): the Monitor that
watches a step and writes the signed capsule, its re-run, and replay are the ones the ``capsule``
command line and C++ trainers use, so a capsule written here is the same file, read by ``capsule
verify / inspect / report / diff`` unchanged, and replays to the same report.

    import capsule

    model = capsule.Model("my_gpt", net, capsule.stages_of(net, ...))
    monitor = capsule.Monitor(capsule_dir="capsules", signing_key="trainer.key")
    monitor.attach(model)
    for step, batch in enumerate(loader):
        with monitor.step(step, batch={"input_ids": x, "labels": y}) as s:
            loss = net(x, y)
            loss.backward()
            s.end(loss=loss.item(), grad_norm=grad_norm(net))
        if s.report["triggered"]:
            print(s.report["summary"])
        optimizer.step()

Layers are explicit: a model is a list of named stages ``(name, fn)`` with ``fn(module, x, batch)``
returning the stage's output; stage i gets stage i-1's output (stage 0 gets the batch's
``input_ids``, or ``inputs``), the last returns the scalar loss, and a stage named after a
submodule (``"blocks.3"``) owns that submodule's parameters. Residual adds and activations
belong inside a stage: that is what makes the layerwise replay and bisect exact. The reference
path is, by default, a float64 copy of the module on CPU running the same stages; pass
``reference=`` to use your own (a plain kernel in place of a fused one).
"""
import os
import sys


def _without_current_dir(path):
    """``path`` less the entries that stand for the current directory (``""``, ``"."``, its
    absolute path): ``python3 -m capsule`` puts the current directory first on ``sys.path``, where
    a stray ``json.py`` would be imported in place of the standard library's."""
    try:
        here = os.getcwd()
    except OSError:  # a current directory that was removed stands for nothing
        return [p for p in path if p not in ("", ".")]
    return [p for p in path if p not in ("", ".") and os.path.abspath(p) != here]


# The package's own imports never come from the current directory, however it was started (a
# trainer's own modules still may: sys.path is put back after them).
_path = list(sys.path)
sys.path[:] = _without_current_dir(sys.path)
try:
    import copy
    import json
    import warnings

    try:
        import torch
    except ImportError as _e:  # another interpreter than the one whose torch the engine links
        raise ImportError(
            f"capsule needs Debian's python3-torch, the PyTorch that shares its LibTorch: run it "
            f"with /usr/bin/python3 (this is {sys.executable}, which cannot import torch: {_e})"
        ) from None
    try:
        from capsule import _capsule
    except ImportError as _e:
        raise ImportError(
            f"capsule's engine (capsule._capsule) was not built for this interpreter "
            f"({sys.executable}, Python {sys.version.split()[0]}): build it with the Python that "
            f"runs it, /usr/bin/python3 ({_e})") from None
finally:
    sys.path[:] = _path + [p for p in sys.path if p not in _path]
    del _path

__all__ = ["Model", "Monitor", "Step", "check_stages", "decoder_stages", "sequential_stages",
           "spike_threshold", "torchvision_stages", "main"]


class Model:
    """A Python model as capsule sees it: named stages over a module, on two paths.

    ``name`` is the name replay looks the model up by (``python3 -P -m capsule replay FILE --model
    pkg.mod:factory`` registers ``factory`` under it); ``config`` is a JSON-serialisable dict, or a
    function returning one at capture time (for runtime state such as the step), stored in the
    capsule and handed back to the factory.
    """

    def __init__(self, name, module, stages, config=None, reference=None, reference_stages=None):
        self.name = name
        self.module = module
        self.stages = [_normalized_stage(module, stage) for stage in stages]
        self.config = config if callable(config) else dict(config or {})
        _warn_unowned(module, self.stages)
        if reference is None:
            # A float64 copy on CPU, refreshed from the trainer's weights before each use.
            self.reference = copy.deepcopy(module).to(device="cpu", dtype=torch.float64)
            self._owns_reference = True
        else:
            self.reference = reference
            self._owns_reference = False
        self.reference_stages = ([_normalized_stage(self.reference, st) for st in reference_stages]
                                 if reference_stages else list(self.stages))
        self.observe_only = False
        self._observed = None
        self._engine = None

    @classmethod
    def observe(cls, name, module, forward, config=None):
        """An observe-only model, for a module not described as stages: ``forward(module,
        batch)`` returns the loss. When a capture re-runs the step, forward hooks on every
        submodule record its output's statistics (and tensor hooks its gradient's), so the capsule
        names the first module whose output went non-finite. Hooks exist only during that re-run:
        training steps pay nothing. Layerwise replay and bisect need named stages; replay of such
        a capsule compares the whole model as one layer, and the capsule says so."""
        seen = []

        def stage(m, x, batch):
            if m is not module:  # the reference copy is not observed
                return forward(m, batch)
            handles = []

            def record(path, output):
                if not isinstance(output, torch.Tensor) or not output.is_floating_point():
                    return
                # A copy: a later module may change this output in place (ReLU(inplace=True)).
                seen.append((path, False, output.detach().clone()))
                if output.requires_grad:
                    output.register_hook(lambda g: seen.append((path, True, g.detach())))

            for path, sub in m.named_modules():
                if path:
                    handles.append(sub.register_forward_hook(
                        lambda mod, inputs, output, path=path: record(path, output)))
            try:
                return forward(m, batch)
            finally:
                for h in handles:
                    h.remove()

        # One stage, "model", owning every parameter ("" is the whole module).
        model = cls(name, module, [("model", stage, "")], config=config)
        model.observe_only = True
        model._observed = seen
        return model

    def _take_observed(self):
        taken = list(self._observed)
        self._observed.clear()
        return taken

    def _config_json(self):
        config = self.config() if callable(self.config) else self.config
        return json.dumps(config, sort_keys=True)

    def _sync_reference(self):
        if not self._owns_reference:
            return
        with torch.no_grad():
            src = dict(self.module.named_parameters())
            for name, p in self.reference.named_parameters():
                p.copy_(src[name].detach().to(device="cpu", dtype=torch.float64))
                p.requires_grad_(src[name].requires_grad)
            # Buffers are state too (BatchNorm's running statistics, its batch count): floating
            # ones in float64 like the weights, the others as they are.
            src = dict(self.module.named_buffers())
            for name, b in self.reference.named_buffers():
                b.copy_(src[name].detach().to(device="cpu", dtype=b.dtype))


    def _engine_model(self):
        if self._engine is None:
            self._engine = _capsule._Model(
                self.name, self._config_json, self.module, self.stages, self.reference,
                self.reference_stages, self._sync_reference,
                self._take_observed if self.observe_only else None)
        return self._engine


def _normalized_stage(module, stage):
    """``(name, fn)`` or ``(name, fn, owners)`` as ``(name, fn, [owner, ...])``: the submodule
    paths or parameter names whose parameters the stage owns. By default a stage owns the
    submodule it is named after, if there is one ("" is the whole module)."""
    if not (isinstance(stage, tuple) and len(stage) in (2, 3) and isinstance(stage[0], str)
            and callable(stage[1])):
        raise TypeError("capsule.Model: each stage is a (name, fn(module, x, batch)) pair, or "
                        "(name, fn, owners) with the submodule paths or parameter names whose "
                        "parameters it owns")
    if len(stage) == 2:
        return (stage[0], stage[1], [stage[0]])
    owners = [stage[2]] if isinstance(stage[2], str) else list(stage[2])
    for owner in owners:
        if not isinstance(owner, str) or _owned_parameters(module, owner) is None:
            raise ValueError(f"capsule.Model: stage '{stage[0]}' owns '{owner}', which is neither "
                             f"a submodule nor a parameter of the module")
    return (stage[0], stage[1], owners)


def _owned_parameters(module, owner):
    """The full names of the parameters `owner` (a submodule path or a parameter name) stands
    for; None when it is neither."""
    try:
        sub = module.get_submodule(owner)
        prefix = owner + "." if owner else ""
        return [prefix + n for n, _ in sub.named_parameters()]
    except AttributeError:
        pass
    try:
        module.get_parameter(owner)
        return [owner]
    except AttributeError:
        return None


def _warn_unowned(module, stages):
    owned = set()
    for _, _, owners in stages:
        for owner in owners:
            owned.update(_owned_parameters(module, owner) or [])
    missing = [n for n, _ in module.named_parameters() if n not in owned]
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8
                                          else "")
        warnings.warn(f"capsule.Model: parameters owned by no stage: {shown}. Layerwise replay, "
                      f"its gradient checks and extracts do not see them; name them among a "
                      f"stage's owners, (name, fn, ['conv_proj', 'class_token']), or build the "
                      f"stages with capsule.torchvision_stages", stacklevel=3)


def sequential_stages(seq, loss_fn, prefix=""):
    """Stages for an ``nn.Sequential`` followed by a loss: one stage per child, named by its
    index, then ``"loss"`` computing ``loss_fn(output, batch)``."""
    if not isinstance(seq, torch.nn.Sequential):
        raise TypeError("sequential_stages: an nn.Sequential is needed; write the stages of a "
                        "module with glue in its forward() by hand")
    stages = []
    for name, _ in seq.named_children():
        path = prefix + name
        stages.append((path, lambda m, x, b, path=path: m.get_submodule(path)(x)))
    stages.append(("loss", lambda m, x, b: loss_fn(x, b)))
    return stages


def decoder_stages(module, loss_fn, embed="embed", blocks="blocks", norm="ln_f", head="lm_head"):
    """Stages for the common decoder shape: an embedding submodule, a ModuleList of blocks, a final
    norm and a head, then ``"loss"`` computing ``loss_fn(logits, batch)``: ``embed``,
    ``blocks.0`` .. ``blocks.N-1``, ``norm``, ``head``, ``loss``, each calling its submodule.
    Raises ValueError naming what is missing. Check them against the module's own forward with
    ``check_stages``: a forward with glue between these calls (a scale after the embedding, a
    residual around the blocks) is refused there, with both losses."""
    def sub(path):
        try:
            return module.get_submodule(path)
        except AttributeError:
            raise ValueError(f"decoder_stages: the module has no submodule '{path}'; name the "
                             f"embedding, blocks, norm and head (embed=, blocks=, norm=, head=) "
                             f"or write the stages by hand") from None
    for path in (embed, norm, head):
        sub(path)
    if not isinstance(sub(blocks), torch.nn.ModuleList):
        raise ValueError(f"decoder_stages: '{blocks}' is a {type(sub(blocks)).__name__}, not an "
                         f"nn.ModuleList of blocks")
    call = lambda path: (path, lambda m, x, b: m.get_submodule(path)(x))
    stages = [call(embed)]
    stages += [call(f"{blocks}.{i}") for i in range(len(sub(blocks)))]
    stages += [call(norm), call(head), ("loss", lambda m, x, b: loss_fn(x, b))]
    return stages


def _cross_entropy(logits, batch):
    return torch.nn.functional.cross_entropy(logits, batch["labels"])


def torchvision_stages(model, loss_fn=_cross_entropy):
    """Stages for torchvision's ``ResNet`` (resnet18 ... resnet152) and ``VisionTransformer``
    (vit_b_16 ...), as their forward() runs, then ``"loss"`` computing ``loss_fn(logits, batch)``
    (default: cross-entropy against ``batch["labels"]``). Every parameter has a stage: a ViT's
    class token and position embedding belong to ``"embed"`` with the patch projection. ResNet:
    ``conv1``, ``bn1``, ``relu``, ``maxpool``, ``layer1`` .. ``layer4``, ``avgpool``,
    ``flatten``, ``fc``; ViT: ``embed``, ``encoder.layers.encoder_layer_0`` .., ``encoder.ln``,
    ``heads`` (on the class token's output)."""
    import torchvision
    call = lambda path: (path, lambda m, x, b: m.get_submodule(path)(x))
    loss = ("loss", lambda m, x, b: loss_fn(x, b))
    if isinstance(model, torchvision.models.ResNet):
        stages = [call(p) for p in ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2",
                                    "layer3", "layer4", "avgpool")]
        stages += [("flatten", lambda m, x, b: torch.flatten(x, 1)), call("fc"), loss]
        return stages
    if isinstance(model, torchvision.models.VisionTransformer):
        def embed(m, x, b):
            x = m._process_input(x)
            x = torch.cat([m.class_token.expand(x.shape[0], -1, -1), x], dim=1)
            return m.encoder.dropout(x + m.encoder.pos_embedding)
        stages = [("embed", embed, ["conv_proj", "class_token", "encoder.pos_embedding"])]
        stages += [call(f"encoder.layers.{name}") for name, _ in
                   model.encoder.layers.named_children()]
        stages += [call("encoder.ln"), ("heads", lambda m, x, b: m.heads(x[:, 0]), ["heads"]),
                   loss]
        return stages
    raise TypeError(f"torchvision_stages: a torchvision ResNet or VisionTransformer is needed, "
                    f"not {type(model).__name__}; write the stages by hand (capsule.Model)")


def check_stages(module, stages, batch, forward, rtol=1e-6):
    """Refuses stages that do not compute what the module's own forward computes.

    Runs the stages on ``batch`` and ``forward(module, batch)`` (the trainer's loss) and raises
    ValueError, with both values, when they differ: the forward has glue (a residual add, an
    activation, a scale) that the stages miss, so layerwise replay and bisect would judge another
    model. Returns the loss the stages computed."""
    x = batch["inputs"] if batch.get("inputs") is not None else batch["input_ids"]
    with torch.no_grad():
        for stage in stages:
            x = stage[1](module, x, batch)
        expected = forward(module, batch)
    got, want = float(x), float(expected)
    if not abs(got - want) <= rtol * max(abs(got), abs(want), 1e-30):
        raise ValueError(f"capsule: the stages compute a loss of {got:.9g}, the module's forward "
                         f"{want:.9g}: its forward has glue the stages miss (a residual add, an "
                         f"activation, a scale); put it inside a stage")
    return got


class Step:
    """One training step under the Monitor (``Monitor.step``). Call ``end(loss=..., grad_norm=...)``
    inside the block; an exception raised in the block becomes an EXCEPTION capsule and does not
    propagate (training goes on). ``report`` holds what happened."""

    def __init__(self, monitor, step, batch, cursor, raw_text, sample_ids, tokens_seen):
        self._monitor = monitor
        self._args = (step, batch, cursor, raw_text, sample_ids, tokens_seen)
        self.report = {"triggered": False, "summary": ""}
        self.exception = None

    def __enter__(self):
        step, batch, cursor, raw_text, sample_ids, tokens_seen = self._args
        model = self._monitor._model
        if model is not None and "training" not in batch:
            # Train or eval decides dropout and BatchNorm's batch statistics: the re-run and the
            # replay run the stages in the mode the trainer's module was in.
            batch = dict(batch, training=model.module.training)
        self._monitor._m.begin_step(step, batch, cursor, raw_text, sample_ids, tokens_seen)
        return self

    def end(self, loss=None, grad_norm=None, learning_rate=None, loss_scale=None):
        self.report = self._monitor._m.end_step(_float(loss), _float(grad_norm),
                                                _float(learning_rate), _float(loss_scale))
        return self.report

    def capture_now(self, reason):
        """A MANUAL capsule of this step. The report's ``refused`` is non-empty (and the log says
        why) when a rate limit kept the capsule from being written."""
        self.report = self._monitor._m.capture_now(reason)
        return self.report

    def __exit__(self, kind, value, tb):
        if kind is None or not issubclass(kind, Exception):
            return False
        self.exception = value
        self.report = self._monitor._m.capture_exception(f"{kind.__name__}: {value}")
        return True


def spike_threshold(recent, kind="loss", **rule):
    """The smallest value that the Monitor's spike trigger fires on after ``recent`` (the loss or
    gradient norm of the steps before, oldest first), or None while the rule is still warming up
    (capture/spike_rule.h). ``kind`` ("loss" or "grad_norm") picks the Monitor's default rule;
    ``rule`` changes its fields as the Monitor's loss_spike / grad_norm_spike options do: window,
    warmup, mads, min_ratio, detrend (judge against a robust line through the log values rather
    than their median), min_rise (the least rise above that level, in the values' units: nats
    for a loss) and max_rise (a rise that fires whatever the spread; 0: off)."""
    return _capsule.spike_threshold([float(x) for x in recent], kind, rule)


def _float(x):
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return float(x.detach().item())
    return float(x)


class Monitor:
    """The trainer-side hook (C++ ``capsule::Monitor``): triggers on a non-finite or spiking loss or
    gradient norm, exceptions and requests; writes one signed capsule per trigger within its rate
    limits; never stops the trainer. Its keyword options are ``MonitorOptions``' fields
    (capture/monitor.h, where each is documented) with the same defaults, listed in
    ``Monitor.OPTIONS`` as the engine declares them (signing_key sets signing_key_path);
    weight_policy is "all", "anomalous_layer" or "none"; loss_spike and grad_norm_spike are dicts
    of window, warmup, mads, min_ratio, detrend, min_rise, max_rise (see ``spike_threshold``);
    declared_frozen lists the names or glob patterns of the parameters meant to stay frozen. An
    unknown option is refused."""

    # The keywords the engine takes, one per MonitorOptions field, in its order.
    OPTIONS = tuple(keyword for keyword, _ in _capsule.MONITOR_OPTIONS)

    def __init__(self, **options):
        self._m = _capsule._Monitor(**options)
        self._model = None

    def attach(self, model):
        self._model = model
        self._m.attach_model(model._engine_model())
        if model.observe_only:
            self._m.annotate("capsule.layers",
                             "observe-only: per-module statistics from hooks; layerwise replay "
                             "and bisect need the model as named stages (capsule.Model)")

    def register_rng(self, name, save, seed=0, restore=None):
        """A user RNG stored in capsules: ``save()`` returns its state as bytes or str. With
        ``restore(state_bytes)``, the capture re-run draws from it as the step did, and it is put
        back afterwards."""
        self._m.register_rng(name, lambda: _as_bytes(save()), seed, restore)

    def register_python_rngs(self):
        """Python's ``random`` and NumPy's global RNG, as ``python.random`` and ``numpy.random``,
        stored in capsules and restored for the capture re-run."""
        import pickle
        import random
        self.register_rng("python.random", lambda: pickle.dumps(random.getstate()),
                          restore=lambda b: random.setstate(pickle.loads(b)))
        try:
            import numpy
            self.register_rng("numpy.random", lambda: pickle.dumps(numpy.random.get_state()),
                              restore=lambda b: numpy.random.set_state(pickle.loads(b)))
        except ImportError:
            pass

    def attach_optimizer(self, optimizer, named_parameters, decay_exempt=None,
                         max_state_bytes=256 << 20):
        """Records the trainer's ``torch.optim`` step in the capsule of a step that triggered, so
        that replay's optimizer stage redoes it in FP64 (C++ ``capsule::OptimizerProbe``):
        every group's lr, betas, eps, weight_decay, amsgrad and maximize, and each parameter's
        step count, exp_avg and exp_avg_sq by its name in ``named_parameters`` (the model's
        ``named_parameters()``), the gradient it was given, and the parameter and moments after
        the step. ``torch.optim.AdamW`` and ``torch.optim.Adam`` are recorded in full; any other
        optimizer is refused with a warning, and its capsules say it was not captured (the groups'
        learning rates and the parameters after the step only, which replay does not redo).
        ``decay_exempt(name, param)`` states the trainer's weight-decay exclusion rule. Call the
        returned probe's ``step()`` (or ``before_step()``, the trainer's own step, then
        ``after_step()``) after ``Step.end``: a capsule of a step that triggered is written
        after it. Returns the ``OptimizerProbe``."""
        named = [(name, p) for name, p in named_parameters]
        kind, _ = _optimizer_kind(optimizer)
        if kind == "other":
            warnings.warn(_not_captured(optimizer), UserWarning, stacklevel=2)
        read = lambda: _optimizer_state(optimizer, named)
        self._m.attach_optimizer(read, named, decay_exempt, max_state_bytes)
        return OptimizerProbe(self, optimizer)

    def set_weights_checkpoint(self, path):
        """The model's weights are now those of this checkpoint (one it loaded or saved, written
        with ``torch.save(model.state_dict(), path)``): a capsule that does not embed every
        weight names it, and replay loads it (as data: nothing in the file is run)."""
        self._m.set_weights_checkpoint(path)

    def set_identity(self, files=(), chat_template="", config_text="", code_revision=""):
        """Hashes identity files (``[(role, path)]``); returns "" or the first error."""
        return self._m.set_identity(list(files), chat_template, config_text, code_revision)

    def log(self, line):
        self._m.log(line)

    def add_event(self, step, kind, detail=""):
        self._m.add_event(step, kind, detail)

    def set_generation(self, **fields):
        """The steps from here on are generation steps (capture/generation.h): every later capsule
        carries ``generation``, and ``capsule replay`` checks the model's incremental decode
        against its whole-sequence forward. Fields: prompt_length, prefill_chunk, temperature,
        top_k, top_p, seed, stop_tokens, cache_layout, cache_dtype, post_rotation_keys,
        quant_scale, adapter_merged, adapter_name, adapter_rank, adapter_alpha, adapter_sha256,
        tokenizer_sha256, template_sha256. No fields:
        training steps again. ValueError for a field out of range, TypeError for an unknown one."""
        self._m.set_generation(fields)

    def step(self, step, batch, cursor=None, raw_text=(), sample_ids=(), tokens_seen=0):
        """One step (a ``Step``, a context manager). ``batch`` holds the tensors the model consumes
        (as ``LayerBatch``, model/layer_sequence.h: "input_ids" or "inputs", "labels",
        "attention_mask", "loss_mask", "response_mask" (1 on the response tokens the loss should
        cover, 0 on a prompt's)) and what the trainer declares of them: "labels_shifted" (default
        True), "training", and of its loss "objective" ("classification": labels [batch] and
        logits [batch, classes]; "language_model"), "reduction" ("mean", "sum",
        "sequence_mean"), "ignore_index" and "label_smoothing"; replay's data and objective
        stages hold the step to them."""
        return Step(self, step, batch, dict(cursor or {}), list(raw_text), list(sample_ids),
                    tokens_seen)

    def wait_for_writes(self):
        """With ``background_write=True``: blocks until every queued capsule is on disk (a
        report's ``queued`` says its ``capsule_path`` is where it will land)."""
        self._m.wait_for_writes()

    @property
    def capsules_written(self):
        return self._m.capsules_written


Monitor.__doc__ += "\n\n    Options: " + ", ".join(Monitor.OPTIONS) + "."


class OptimizerProbe:
    """The optimizer step of a ``Monitor`` (``Monitor.attach_optimizer``). Nothing is copied on a
    step without a capture. A failure to read the optimizer is logged and noted in the capsule;
    it never reaches the trainer."""

    def __init__(self, monitor, optimizer):
        self._monitor = monitor
        self.optimizer = optimizer

    def before_step(self, clip_max_norm=0.0, grad_norm_before_clip=None, loss_scale=0.0,
                    found_inf=False, order=(), scheduled_lr=()):
        """Right before ``optimizer.step()``, after unscaling and clipping; the arguments say what
        the trainer did (C++ ``OptimizerStepInfo``)."""
        self._monitor._m.optimizer_before_step(
            float(clip_max_norm), _float(grad_norm_before_clip), float(loss_scale),
            bool(found_inf), list(order), [_float(x) for x in scheduled_lr])

    def after_step(self):
        """Right after ``optimizer.step()``: writes the waiting capsule and returns its report
        (an empty one when none was waiting)."""
        return self._monitor._m.optimizer_after_step()

    def step(self, closure=None, **info):
        """``before_step(**info)``, ``optimizer.step(closure)``, ``after_step()``; returns the
        report."""
        self.before_step(**info)
        self.optimizer.step(closure)
        return self.after_step()


def _optimizer_kind(optimizer):
    """("adamw" | "adam" | "other", the class's name): exactly torch's classes, since a subclass
    may step otherwise."""
    cls = type(optimizer)
    module = "torch.optim" if cls.__module__.startswith("torch.optim.") else cls.__module__
    name = f"{module}.{cls.__qualname__}"
    if cls is torch.optim.AdamW:
        return "adamw", "torch.optim.AdamW"
    if cls is torch.optim.Adam:
        return "adam", "torch.optim.Adam"
    return "other", name


def _not_captured(optimizer):
    return (f"{_optimizer_kind(optimizer)[1]} is not captured: only torch.optim.AdamW and "
            f"torch.optim.Adam are; capsules record its groups' learning rates and the "
            f"parameters after the step, which replay's optimizer stage does not redo")


def _optimizer_state(optimizer, named):
    """What the C++ probe reads of a torch.optim optimizer (python/py_monitor.cc,
    OptimizerStateFrom)."""
    kind, cls = _optimizer_kind(optimizer)
    groups, group_of = [], {}
    for g, group in enumerate(optimizer.param_groups):
        betas = group.get("betas", (0.0, 0.0))
        groups.append({"lr": float(group["lr"]), "beta1": float(betas[0]),
                       "beta2": float(betas[1]), "eps": float(group.get("eps", 0.0)),
                       "weight_decay": float(group.get("weight_decay", 0.0)),
                       "amsgrad": bool(group.get("amsgrad", False)),
                       "maximize": bool(group.get("maximize", False))})
        for p in group["params"]:
            group_of[id(p)] = g
    params = {}
    for name, p in named:
        state = optimizer.state.get(p, {}) if kind != "other" else {}
        step = state.get("step", 0)
        params[name] = (group_of.get(id(p), -1),
                        int(step.item() if isinstance(step, torch.Tensor) else step),
                        state.get("exp_avg"), state.get("exp_avg_sq"))
    return {"kind": kind, "class": cls, "groups": groups, "params": params,
            "not_captured": _not_captured(optimizer) if kind == "other" else ""}


def _as_bytes(state):
    return state if isinstance(state, (bytes, bytearray)) else str(state).encode()


def main(argv=None):
    """``python3 -P -m capsule SUBCOMMAND ...``: the capsule command line, in this process. For
    commands that run a model (replay, extract, gate, minimize, stress), ``--model
    pkg.module:factory`` names the function that rebuilds the model from its config dict (it
    returns a ``capsule.Model``); it may stand anywhere among the options, and the module is looked
    up on ``sys.path`` as ``python3 -P -m capsule`` leaves it: PYTHONPATH and installed packages,
    never the current directory. Returns the exit status (2 for a ``--model`` that cannot be
    imported)."""
    import importlib
    args = list(sys.argv[1:] if argv is None else argv)
    factory, spec = None, None
    for i, a in enumerate(args):
        if a == "--model" or a.startswith("--model="):
            if a == "--model":
                if i + 1 >= len(args):
                    print("capsule: --model needs pkg.module:function", file=sys.stderr)
                    return 2
                spec = args[i + 1]
                del args[i:i + 2]
            else:
                spec = a[len("--model="):]
                del args[i]
            break
    if spec is not None:
        module_name, _, fn = spec.partition(":")
        if not module_name or not fn:
            print(f"capsule: --model {spec}: want pkg.module:function", file=sys.stderr)
            return 2
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            print(f"capsule: --model {spec}: cannot import {module_name} ({e}); is its folder "
                  f"on PYTHONPATH?", file=sys.stderr)
            return 2
        made = getattr(module, fn, None)
        if not callable(made):
            print(f"capsule: --model {spec}: {module_name} has no function {fn}",
                  file=sys.stderr)
            return 2
        factory = lambda config_json: made(json.loads(config_json))
    model_args = ["--model", spec] if spec is not None else []
    return _capsule.cli_main(["capsule"] + args, factory, "python3 -P -m capsule", model_args)
