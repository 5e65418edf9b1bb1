"""Slack's payloads read into typed models: what a button click and the `/vllm` command carry.

Only the fields the bot uses are declared; Slack sends many more, which are ignored. A payload
that lacks one of them does not read: `read()` raises PayloadError, whose text is one line
naming what is missing, for the app to log and answer instead of failing with a traceback.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from bot.app.records import MessageRef

Text = Annotated[str, Field(min_length=1)]  # an id or value Slack always fills; empty means unusable


class _Payload(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class IdRef(_Payload):
    id: str | None = None


class MessageTs(_Payload):
    ts: str | None = None
    text: str | None = None  # the message's fallback text (it names the incident's cluster)


class Container(_Payload):
    channel_id: str | None = None
    message_ts: str | None = None


class ClickPlace(_Payload):
    """Where a click happened. Slack names the channel and message twice (top level and in
    `container`); either will do, and a click outside a message has neither."""

    channel: IdRef | None = None
    message: MessageTs | None = None
    container: Container | None = None

    @property
    def channel_id(self) -> str | None:
        return (self.channel.id if self.channel else None) or (self.container.channel_id if self.container else None)

    @property
    def message_text(self) -> str | None:
        return self.message.text if self.message else None

    @property
    def message_ref(self) -> MessageRef | None:
        ts = (self.message.ts if self.message else None) or (self.container.message_ts if self.container else None)
        channel = self.channel_id
        return MessageRef(channel=channel, message_id=ts) if channel and ts else None


class ClickOrigin(ClickPlace):
    """Who clicked and where, read leniently: enough to answer a click that cannot be read."""

    user: IdRef | None = None


class User(_Payload):
    id: Text


class ButtonAction(_Payload):
    action_id: Text
    value: Text  # Approve/Reject: "<incident name>|<proposal digest>"; Roll back: the incident name


class ButtonClick(ClickPlace):
    """A block_actions payload from one of the bot's buttons."""

    user: User
    actions: list[ButtonAction] = Field(min_length=1)

    @property
    def user_id(self) -> str:
        return self.user.id

    @property
    def incident(self) -> str:
        return self.actions[0].value.partition("|")[0]

    @property
    def digest(self) -> str | None:
        """The digest of the proposal the clicked message showed; None for a value without one
        (a message posted before digests existed, or a Roll back button)."""
        name, sep, digest = self.actions[0].value.partition("|")
        return digest if sep and digest else None


class SlashCommand(_Payload):
    """The form Slack posts for `/vllm TEXT`."""

    user_id: Text
    channel_id: Text
    text: str = ""

    @field_validator("text", mode="before")
    @classmethod
    def _no_text_is_empty_text(cls, value: Any) -> Any:
        return value or ""

    @property
    def verb(self) -> str:
        return self.text.strip().partition(" ")[0].lower()

    @property
    def argument(self) -> str:
        return self.text.strip().partition(" ")[2].strip()


class PayloadError(ValueError):
    """A payload without what the bot needs; the message is one line."""


P = TypeVar("P", bound=BaseModel)


def read(model: type[P], data: Any) -> P:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise PayloadError(f"{model.__name__}: {describe(exc)}") from None


def describe(exc: ValidationError) -> str:
    """`actions.0.value: Field required; user: Field required`, one line for the log."""
    return "; ".join(f"{'.'.join(str(part) for part in error['loc']) or '(payload)'}: {error['msg']}"
                     for error in exc.errors())


def click_origin(body: Any) -> ClickOrigin:
    """Who clicked and where, as far as the payload says; nothing when it says nothing usable."""
    try:
        return ClickOrigin.model_validate(body)
    except ValidationError:
        return ClickOrigin()
