"""The settings of one small-model routing alias (`small_model[]`), and the route they make."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from routing.model_select import DEFAULT_HARD_MARKERS, SmallModelRoute

HARD_SHARE_FLOOR = 0.10  # no alias may send more of the hard prompts small, pressure or not


class SmallModelRouteSettings(BaseModel):
    """One routing alias choosing, per request, between a large and a small model. Rules send a
    request large for certain (tools or response_format, a prompt past the small model's window,
    more output than allowed, many turns, a hard marker, the pin header); a classifier scores
    the rest, and a score below the alias's threshold sends it small."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    alias: str = Field(min_length=1, description="The model name clients send.")
    large: str = Field(min_length=1, description="The model hard requests go to.")
    small: str = Field(min_length=1, description="The model easy requests may go to.")
    mode: Literal["easy", "overflow", "shadow"] = Field(
        default="easy",
        description="easy: every easy request goes to the small model. overflow: only while the "
        "large model is busy (requests wait for it in the gateway queue, or every backend "
        "serving it reports waiting sequences or KV usage at routing.high_water) or when its "
        "admission refuses the request. shadow: decide and report (metrics, "
        "x-kvgate-model-reason) but send everything to the large model.")
    max_prompt_tokens: int = Field(
        default=1024, ge=1,
        description="The small model's window: a longer prompt (estimated at 4 characters a "
        "token) goes to the large model.")
    max_output_tokens: int = Field(
        default=512, ge=1,
        description="A request whose max_tokens is above this goes to the large model; one "
        "without max_tokens is left to the classifier.")
    max_turns: int = Field(default=6, ge=1,
                           description="A conversation with more user turns goes large.")
    hard_markers: tuple[str, ...] = Field(
        default=DEFAULT_HARD_MARKERS,
        description="A request whose text has one of these as whole words (any case; `re:` "
        "starts a regular expression) goes large; the list replaces the default.")
    classifier: Literal["auto", "minilm", "hashed"] = Field(
        default="auto",
        description="The classifier: minilm (the local embedding model, kvgate[semantic]), "
        "hashed (hashed word features, no model), auto (minilm when the semantic cache runs the "
        "local model, reading the embedding it computes for the request; else hashed).")
    max_hard_share: float = Field(
        default=0.05, ge=0.0, le=HARD_SHARE_FLOOR,
        description="The share of hard prompts the alias may send small: the threshold is the "
        "one meeting it on the classifier's calibration set (see kvgate route-eval).")
    threshold: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="The score threshold itself (a prompt scoring below it is easy), instead "
        "of max_hard_share; `kvgate route-eval --calibrate` prints one.")
    pressure_step: float = Field(
        default=0.05, ge=0.0, le=1.0,
        description="Under pressure on the large model (as for mode overflow's busy) the "
        "threshold rises by this much, never past pressure_max_hard_share's threshold.")
    pressure_max_hard_share: float = Field(
        default=HARD_SHARE_FLOOR, ge=0.0, le=HARD_SHARE_FLOOR,
        description="The most hard prompts the loosened threshold may send small.")

    @model_validator(mode="after")
    def _distinct_models(self) -> SmallModelRouteSettings:
        if self.large == self.small:
            raise ValueError(f"route {self.alias!r}: large and small are both {self.large!r}")
        if self.alias in (self.large, self.small):
            raise ValueError(f"route {self.alias!r}: the alias must not be one of its models")
        return self

    def to_route(self) -> SmallModelRoute:
        return SmallModelRoute(
            alias=self.alias, large=self.large, small=self.small, mode=self.mode,
            max_prompt_tokens=self.max_prompt_tokens, max_output_tokens=self.max_output_tokens,
            max_turns=self.max_turns, hard_markers=tuple(m for m in self.hard_markers if m))
