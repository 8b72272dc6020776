"""Error kinds of the gradfuzz runtime (ops/errors.h), as Python exceptions.

The torch backend raises them; the te backend's custom ops raise InvalidArgumentError where
the C++ op raises its InvalidArgumentError. `kind` is the stable identifier the harness
compares across paths. This module imports nothing, so export scripts can embed it.
"""


class GradfuzzError(Exception):
    """Base of every runtime misuse error; `kind` names it ("missing-producer")."""

    kind = "unrecognized"


class SlotOutOfRangeError(GradfuzzError, IndexError):
    """Binding slot index outside [0, number of slots)."""

    kind = "slot-out-of-range"


class InvalidChannelNameError(GradfuzzError, ValueError):
    """Empty channel name given to a setter."""

    kind = "invalid-channel-name"


class LockedError(GradfuzzError, RuntimeError):
    """Binding changed on an op that a persistent fuser or Sequential has locked."""

    kind = "locked"


class DuplicateProducerError(GradfuzzError, ValueError):
    """Two output slots of one fuser registered the same channel name."""

    kind = "duplicate-producer"


class MissingProducerError(GradfuzzError, ValueError):
    """A bound input slot whose channel has no producer in the same fuser."""

    kind = "missing-producer"


class ProducerNotEarlierError(GradfuzzError, ValueError):
    """A bound input slot whose producer sits at or after the consumer."""

    kind = "producer-not-earlier"


class PlanMismatchError(GradfuzzError, RuntimeError):
    """A fusion plan whose fused op does not cover the next basic ops in order."""

    kind = "plan-mismatch"


class ExtraCountError(GradfuzzError, RuntimeError):
    """An op returned the wrong number of extra outputs or extra-input gradients."""

    kind = "extra-count"


class PublicOutputNoneError(GradfuzzError, RuntimeError):
    """A public extra output came back as None."""

    kind = "public-output-returned-none"


class NeededOutsideFusionError(GradfuzzError, RuntimeError):
    """An extra output came back as None although a consumer outside its group needs it."""

    kind = "needed-outside-its-fusion"


class ExtraInputCountError(GradfuzzError, ValueError):
    """The caller passed too many or too few public extra inputs."""

    kind = "extra-input-count"


class InvalidArgumentError(GradfuzzError, ValueError):
    """A tensor argument or attr with the wrong shape, dtype or value."""

    kind = "invalid-argument"


class GeneratorMisuseError(GradfuzzError, TypeError):
    """A single-pass extra-output generator was sized, indexed or read twice."""

    kind = "generator-misuse"


class UnknownNameError(GradfuzzError, KeyError):
    """Unknown op or fusion name, or bad options for a known one."""

    kind = "unknown-name"

    def __str__(self):
        # KeyError quotes its argument; the message reads better without.
        return str(self.args[0]) if self.args else ""


ERROR_TYPES = (
    SlotOutOfRangeError,
    InvalidChannelNameError,
    LockedError,
    DuplicateProducerError,
    MissingProducerError,
    ProducerNotEarlierError,
    PlanMismatchError,
    ExtraCountError,
    PublicOutputNoneError,
    NeededOutsideFusionError,
    ExtraInputCountError,
    InvalidArgumentError,
    GeneratorMisuseError,
    UnknownNameError,
)
