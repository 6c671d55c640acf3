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
import copy
import json
import os

import torch

from capsule import _capsule

__all__ = ["Model", "Monitor", "Step", "check_stages", "decoder_stages", "sequential_stages",
           "main"]


class Model:
    """A Python model as capsule sees it: named stages over a module, on two paths.

    ``name`` is the name replay looks the model up by (``python3 -m capsule replay FILE --model
    pkg.mod:factory`` registers ``factory`` under it); ``config`` is a JSON-serialisable dict, or a
    function returning one at capture time (for runtime state such as the step), stored in the
    capsule and handed back to the factory.
    """

    def __init__(self, name, module, stages, config=None, reference=None, reference_stages=None):
        self.name = name
        self.module = module
        self.stages = list(stages)
        self.config = config if callable(config) else dict(config or {})
        for stage in self.stages:
            if not (isinstance(stage, tuple) and len(stage) in (2, 3) and callable(stage[1])):
                raise TypeError("capsule.Model: each stage is a (name, fn(module, x, batch)) pair, "
                                "or (name, fn, owner) with the submodule path owning its "
                                "parameters")
        if reference is None:
            # A float64 copy on CPU, refreshed from the trainer's weights before each use.
            self.reference = copy.deepcopy(module).to(device="cpu", dtype=torch.float64)
            self._owns_reference = True
        else:
            self.reference = reference
            self._owns_reference = False
        self.reference_stages = list(reference_stages or self.stages)
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
                seen.append((path, False, output.detach()))
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

    def _engine_model(self):
        if self._engine is None:
            self._engine = _capsule._Model(
                self.name, self._config_json, self.module, self.stages, self.reference,
                self.reference_stages, self._sync_reference,
                self._take_observed if self.observe_only else None)
        return self._engine


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


def check_stages(module, stages, batch, forward, rtol=1e-6):
    """Refuses stages that do not compute what the module's own forward computes.

    Runs the stages on ``batch`` and ``forward(module, batch)`` (the trainer's loss) and raises
    ValueError, with both values, when they differ: the forward has glue (a residual add, an
    activation, a scale) that the stages miss, so layerwise replay and bisect would judge another
    model. Returns the loss the stages computed."""
    x = batch["inputs"] if batch.get("inputs") is not None else batch["input_ids"]
    with torch.no_grad():
        for _, fn in stages:
            x = fn(module, x, batch)
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
        self._monitor._m.begin_step(step, batch, cursor, raw_text, sample_ids, tokens_seen)
        return self

    def end(self, loss=None, grad_norm=None, learning_rate=None, loss_scale=None):
        self.report = self._monitor._m.end_step(_float(loss), _float(grad_norm),
                                                _float(learning_rate), _float(loss_scale))
        return self.report

    def capture_now(self, reason):
        self.report = self._monitor._m.capture_now(reason)
        return self.report

    def __exit__(self, kind, value, tb):
        if kind is None or not issubclass(kind, Exception):
            return False
        self.exception = value
        self.report = self._monitor._m.capture_exception(f"{kind.__name__}: {value}")
        return True


def _float(x):
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return float(x.detach().item())
    return float(x)


class Monitor:
    """The trainer-side hook (C++ ``capsule::Monitor``): triggers on a non-finite or spiking loss or
    gradient norm, exceptions and requests; writes one signed capsule per trigger within its rate
    limits; never stops the trainer. Options, as ``MonitorOptions`` in capture/monitor.h with
    the same defaults: capsule_dir, signing_key, run_name, max_capsules,
    min_steps_between_same_kind, weight_policy ("all", "anomalous_layer", "none"),
    max_weight_bytes, weights_checkpoint, history_length, log_lines, trigger_non_finite_loss,
    trigger_non_finite_grad, trigger_loss_spike, trigger_grad_norm_spike, loss_spike and
    grad_norm_spike (dicts of window, warmup, mads, min_ratio), rerun, background_write,
    background_queue_depth, rank, world_size, local_rank, device, annotations, log_sink. An
    unknown option is refused."""

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

    def step(self, step, batch, cursor=None, raw_text=(), sample_ids=(), tokens_seen=0):
        return Step(self, step, batch, dict(cursor or {}), list(raw_text), list(sample_ids),
                    tokens_seen)

    def wait_for_writes(self):
        """With ``background_write=True``: blocks until every queued capsule is on disk (a
        report's ``queued`` says its ``capsule_path`` is where it will land)."""
        self._m.wait_for_writes()

    @property
    def capsules_written(self):
        return self._m.capsules_written


def _as_bytes(state):
    return state if isinstance(state, (bytes, bytearray)) else str(state).encode()


def main(argv=None):
    """``python3 -m capsule SUBCOMMAND ...``: the capsule command line, in this process. For
    ``replay`` and ``extract``, ``--model pkg.module:factory`` names the function that rebuilds the
    model from its config dict (it returns a ``capsule.Model``)."""
    import importlib
    import sys
    args = list(sys.argv[1:] if argv is None else argv)
    factory = None
    if "--model" in args:
        i = args.index("--model")
        if i + 1 >= len(args):
            print("capsule: --model needs pkg.module:function", file=sys.stderr)
            return 2
        spec = args[i + 1]
        del args[i:i + 2]
        module_name, _, fn = spec.partition(":")
        if not fn:
            print(f"capsule: --model {spec}: want pkg.module:function", file=sys.stderr)
            return 2
        made = getattr(importlib.import_module(module_name), fn)
        factory = lambda config_json: made(json.loads(config_json))
    name = ""
    if factory is not None and len(args) >= 2 and os.path.exists(args[1]):
        try:
            name = _capsule.registry_name_of(args[1])
        except RuntimeError:
            name = ""  # the command itself reports what is wrong with the file
    return _capsule.cli_main(["capsule"] + args, name, factory)
