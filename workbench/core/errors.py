"""Every exception the workbench raises on purpose, in one place.

Each one means "bad input or an unsafe state, and the message says the fix"; the command line turns
the input errors into exit code 2. This is each class's one home: import it from here, never through
the module that raises it. Nothing here imports
anything: ``workbench.audit`` (torch and the standard library only) uses these classes too.
"""


class NonFiniteError(FloatingPointError):
    """A loss, gradient or logit became NaN or infinite; the run stopped before corrupting the weights."""


class ConfigError(ValueError):
    """An invalid trainer configuration value; the message names the field and the fix. ``field``: the config field's
    name (the command line names its option after it), None where the problem is not one field's."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class InputError(ValueError):
    """Bad command-line input detected before training starts."""


class ParameterError(ValueError):
    """A notebook parameter (or a typed command-line value) that does not exist or has the wrong type."""


class ModelLoadError(ValueError):
    """A checkpoint or tokenizer that the workbench refuses to load, with the fix in the message."""


class AttentionBackendUnavailable(RuntimeError):
    """An attention implementation was requested that cannot run on this machine."""


class AttentionBackwardError(ValueError):
    """A policy to be trained through an attention back-end whose gradients were measured wrong, or not verified, at
    its head dim, release and GPU (``core.attention_backward``); training would apply wrong updates without any error.
    The message says what was measured and the two ways forward."""


class PromptMaskError(ValueError):
    """Prompt lengths and loss-mask rows disagree in number (the S4 zip truncation)."""


class RightPaddingError(ValueError):
    """A right-padded batch where right padding is unsafe (cached generation / old Qwen2 flash path)."""


class AuditSignatureError(TypeError):
    """A user callable whose signature (or return value) is not what the audit check expects."""


class AuditInputError(ValueError):
    """A MODULE:FUNCTION spec that does not name an importable callable."""


class ResumeError(InputError):
    """An output folder whose checkpoints cannot be resumed as asked: saved under another config, or
    with no checkpoint that verifies. Nothing was trained; the message gives the ways forward."""


class RunFolderInUse(InputError):
    """An output folder another training or catalogue run is writing to (its lock, ``<folder>/.lock``, is held:
    ``core.folder_lock``): two writers in one folder would interleave their files. Nothing was run."""


class NotebookStopped(Exception):
    """Raised by ``notebook_api.stop_here`` after a notebook recorded why this checkpoint cannot show its
    pitfall at all (e.g. a chat-template pitfall on a checkpoint without a template). The runner counts
    such a run as completed, with the reason in ``metrics.json``, not as a failure."""


class RolloutCorrectionError(ValueError):
    """A rollout-correction option, threshold or tensor that ``core.rollout_correction`` refuses; the message
    names the parameter and the fix. ``parameter``: that parameter's name."""

    def __init__(self, message: str, parameter: str | None = None):
        super().__init__(message)
        self.parameter = parameter


class EngineUnavailable(RuntimeError):
    """The inference engine (``workbench.engines``) cannot run here: its environment is missing or failed to build, or
    its process died; the message says why and the fix (``make engines``)."""


class EngineError(ValueError):
    """A model or setting the inference engine refuses (a head dim its CPU attention lacks, a dtype it did not load),
    or an engine call that failed; the message names the problem and the fix."""
