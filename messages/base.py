"""Base classes for body models (immutable, no unknown fields, one `type` discriminator), and
the validations every side runs: a request against its own model, a reply against the result
model its request declares (strictly between owners of one node; tolerating fields it does not
know on a client, and on a node reading another node's reply, which a node one release newer
may add: `validated_reply`).

It must never import an owner's schema module: a client that validates one request loads only
that request's module (`protocol.py` builds the union of all of them, for the node)."""

from typing import Any, ClassVar, TypeVar, cast

from pydantic import BaseModel, ConfigDict, ValidationError

from subagents_node.messages.errors import BadRequest
from subagents_node.messages.tolerant import known_fields


class Message(BaseModel):
    """A body model. Frozen, and unknown fields are errors: a typo must not pass silently.
    Strict: a value of another type is an error, never converted (pydantic's lax mode read
    `True` as a limit of 1, `"5"` as 5 and `background="no"` as False). An int is still a
    float; a tuple field takes the list msgpack decodes only with `Field(strict=False)`.

    Its validator is built when it is first used, not when the class is defined: a process
    defines every model of the protocols it imports but validates only a few of them."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True, strict=True)

    #: Optional fields a later release added, left out of the body while they are None (their
    #: default): a node of the release before them refuses a field it does not know, so a
    #: request that does not use them reaches it as that release's clients sent it.
    added_later: ClassVar[tuple[str, ...]] = ()

    def to_body(self) -> dict[str, Any]:
        if type(self).__pydantic_complete__:
            # Straight to the built serializer: `model_dump`'s keyword handling costs about a
            # third of dumping a small request, once per request sent.
            # (The type travels in the envelope.)
            body = cast(
                dict[str, Any], self.__pydantic_serializer__.to_python(self, exclude={"type"})
            )
        else:
            body = self.model_dump(mode="python", exclude={"type"})
        for name in self.added_later:
            if body.get(name, 0) is None:
                del body[name]
        return body


M = TypeVar("M", bound=Message)


def validated(kind: type[M], data: Any) -> M:
    """`kind.model_validate(data)`, straight to the built validator once the model is built
    (its first validation builds it: models defer that, `Message`): the wrapper's keyword
    handling costs about a quarter of validating a small request or reply."""
    if kind.__pydantic_complete__:
        return cast(M, kind.__pydantic_validator__.validate_python(data))
    return kind.model_validate(data)


def validated_reply(kind: type[M], data: Any) -> M:
    """`validated`, as a client reads what a node sent: a field the model does not know, at any
    level, is dropped, never an error (a node one release newer than its client may add fields
    to a reply: docs/api.md, "Compatibility"). Anything else wrong is the error `validated`
    raises for it.

    Strict first, so a reply of this release costs what it always did; only a refusal that
    names an unknown field validates again, once those fields are dropped (`known_fields`)."""
    try:
        # `validated`, written out: this runs once per reply a client reads.
        if kind.__pydantic_complete__:
            return cast(M, kind.__pydantic_validator__.validate_python(data))
        return kind.model_validate(data)
    except ValidationError as exc:
        raw = exc.errors(include_url=False, include_context=False, include_input=False)
        if not isinstance(data, dict) or all(e["type"] != "extra_forbidden" for e in raw):
            raise
    return validated(kind, known_fields(kind, data))


class Ack(Message):
    """The result of a request whose only answer is 'done'."""

    ok: bool = True


ResultType = type[Message]
"""Alias: inside request classes the field `type` shadows the builtin in annotations."""


class Request(Message):
    """A request body. Subclasses fix `type` with a Literal and name the owning actor.

    `target` is the actor that owns the state the request touches ('' = any owner actor,
    chosen by the envelope; used only by fault-injection requests). `Result` is the model the
    reply body validates into on the client.
    """

    type: str
    #: The value of `type` each subclass fixes, read once when the class is made.
    wire_type: ClassVar[str] = ""
    target: ClassVar[str] = ""
    Result: ClassVar[ResultType] = Ack
    #: True for queries that never write: the owner may answer them without taking the
    #: store's write lock (only the owner writes its tables, so plain reads are consistent).
    read_only: ClassVar[bool] = False
    #: True when sending it twice has the effect of sending it once, so a client may send it
    #: again after its owner restarted with it in flight (every read-only query is so too).
    idempotent: ClassVar[bool] = False
    #: True for an operator's act that only the node's own user may ask for: the node serves
    #: it on its ipc socket only and refuses it from every tcp peer (`protocol.local_only`).
    local_only: ClassVar[bool] = False

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls.wire_type = str(cls.model_fields["type"].default)

    def resendable_as_sent(self) -> bool:
        """Whether this very request may be sent again after it was lost with its owner: its
        type is `resendable`, or (a few writes) the id it carries makes a second send count
        nothing more."""
        return resendable(self)

    @property
    def held_s(self) -> float:
        """How long its owner may hold it before answering, by design (a long poll's wait):
        whoever forwards it waits this long beyond its usual call timeout."""
        return 0.0


def resendable(request: Request | type[Request]) -> bool:
    """Whether a request lost with a restarted owner may simply be sent again."""
    return request.read_only or request.idempotent


Q = TypeVar("Q", bound=Request)


def schema_error(type_: str, exc: ValidationError) -> BadRequest:
    """A typed BadRequest naming the first invalid field. The reply is bounded whatever the
    request held: at most MAX_REPORTED_FIELD_ERRORS fields, each location and message cut to
    MAX_ERROR_TEXT characters, and `error_count` says how many there were in all."""
    raw = exc.errors(include_url=False, include_context=False, include_input=False)
    errors = [
        {"loc": _clip(_field(type_, e["loc"])), "msg": _clip(_message(e["type"], str(e["msg"])))}
        for e in raw[:MAX_REPORTED_FIELD_ERRORS]
    ]
    first = errors[0] if errors else {"loc": "", "msg": "invalid"}
    return BadRequest(
        f"invalid {type_} request: {first['loc']}: {first['msg']}",
        reason="schema",
        field=first["loc"],
        errors=errors,
        error_count=exc.error_count(),
    )


#: how many field errors a BadRequest lists (the count says how many there were)
MAX_REPORTED_FIELD_ERRORS = 10
#: longest field location or message a BadRequest repeats (longer ones are cut, marked by …)
MAX_ERROR_TEXT = 160


def _message(kind: str, message: str) -> str:
    """pydantic's message, but for text that was not UTF-8 (bytes a shell argument or a
    variable held, as lone surrogates): "Input should be a valid string, unable to parse raw
    data as a unicode string" told a CLI user nothing about the byte at fault."""
    if kind == "string_unicode":
        return "not UTF-8 text (it holds a byte that is no UTF-8 character)"
    return message


def _field(type_: str, loc: tuple[int | str, ...]) -> str:
    # The request union puts the discriminator first ("capacity.rollback.handle.slot"): the
    # caller named the type already, the field is what it needs.
    parts = loc[1:] if loc and loc[0] == type_ else loc
    return ".".join(str(p) for p in parts)


def _clip(text: str) -> str:
    return text if len(text) <= MAX_ERROR_TEXT else text[: MAX_ERROR_TEXT - 1] + "…"


def validate_request(kind: type[Q], fields: dict[str, Any]) -> Q:
    """Build a request the way the node's gateway validates it: a bad value is a BadRequest."""
    type_ = kind.wire_type
    try:
        return validated(kind, {**fields, "type": type_})
    except ValidationError as exc:
        raise schema_error(type_, exc) from None


def parse_result(request: Request, body: dict[str, Any]) -> Message:
    """Validate a reply body into the result model the request declares, strictly: for an
    owner reading another owner of its own node (one release: an unknown field is a bug)."""
    try:
        return validated(request.Result, body)
    except ValidationError as exc:
        raise _reply_error(request, exc) from None


def parse_reply(request: Request, body: dict[str, Any]) -> Message:
    """`parse_result` as a client reads a node's reply (and a worker its home's): fields it
    does not know, at any level, are dropped (`validated_reply`); any other fault is the same
    BadRequest."""
    try:
        return validated_reply(request.Result, body)
    except ValidationError as exc:
        raise _reply_error(request, exc) from None


def _reply_error(request: Request, exc: ValidationError) -> BadRequest:
    bounded = schema_error(f"reply to {request.type}", exc)
    return BadRequest(bounded.message, **{**bounded.details, "reason": "reply"})
