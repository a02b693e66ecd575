"""Generated workloads: AWS long context, SGLang generated-shared-prefix, LMCache multi-round QA.

Content ids are derived from seeded hashes of a name, so two requests share a prefix exactly when
the workload says they do, and the same seed gives the same workload.

Every count and token length has an upper bound (a document over it is rejected at load time
naming the field): a workload is at most ``MAX_REQUESTS`` requests, a segment at most
``trace_format.MAX_TOKENS`` tokens. Given ``limit`` (the scenario's ``requests``), a generator
builds only the first ``limit`` requests, the same ones the whole workload begins with.
"""

from __future__ import annotations

import random
from typing import Literal

from pydantic import Field, model_validator

from warmfleet.api.trace_format import MAX_TOKENS
from warmfleet.core.config import StrictModel
from warmfleet.core.errors import ConfigError
from warmfleet.core.hashing import hash_str
from warmfleet.sim.workloads.base import Segment, WorkloadRequest

# The most requests a generated workload makes (a simulated run of that many takes many minutes).
MAX_REQUESTS = 1_000_000
# The longest conversation of multi-round QA: each round's prompt holds every earlier round.
MAX_ROUNDS = 1_000


def _content_id(seed: int, *parts: object) -> int:
    return hash_str(":".join(str(p) for p in parts), seed)


class AwsLongContextConfig(StrictModel):
    """Groups of requests sharing an 8,000-token prefix, each with a unique question (AWS blog).

    ``groups`` unset: chosen so the groups' prefixes total ``working_set_ratio`` times one
    instance's KV capacity.
    """

    type: Literal["aws-long-context"] = "aws-long-context"
    groups: int | None = Field(None, ge=1, le=MAX_REQUESTS)
    working_set_ratio: float = Field(4.0, gt=0.0, le=1e6)
    requests_per_group: float = Field(16.0, gt=0.0, le=MAX_REQUESTS)
    requests: int | None = Field(None, ge=1, le=MAX_REQUESTS)
    prefix_tokens: int = Field(8000, ge=1, le=MAX_TOKENS)
    question_tokens: int = Field(200, ge=1, le=MAX_TOKENS)
    output_tokens: int = Field(256, ge=1, le=MAX_TOKENS)


def aws_long_context(
    config: AwsLongContextConfig, instance_kv_tokens: int, seed: int, limit: int | None = None
) -> tuple[WorkloadRequest, ...]:
    """The workload's requests (the first ``limit`` of them); a derived count over
    ``MAX_REQUESTS`` is a ConfigError naming the fields it comes from."""
    groups = config.groups or max(
        1, round(config.working_set_ratio * instance_kv_tokens / config.prefix_tokens)
    )
    count = config.requests or max(1, round(groups * config.requests_per_group))
    count = count if limit is None else min(count, limit)
    if count > MAX_REQUESTS:
        raise ConfigError(
            f"workload: groups x requestsPerGroup is {count} requests, more than {MAX_REQUESTS}"
            " (set workload.requests or --requests)"
        )
    rng = random.Random(seed)
    out = []
    for index in range(count):
        group = rng.randrange(groups)
        segments = (
            Segment(_content_id(seed, "aws-lc-prefix", group), config.prefix_tokens),
            Segment(_content_id(seed, "aws-lc-question", index), config.question_tokens),
        )
        out.append(WorkloadRequest(index, 0.0, segments, config.output_tokens))
    return tuple(out)


class GspConfig(StrictModel):
    """SGLang ``generated-shared-prefix`` (bench_serving defaults), requests shuffled."""

    type: Literal["gsp"] = "gsp"
    groups: int = Field(64, ge=1, le=MAX_REQUESTS)
    prompts_per_group: int = Field(16, ge=1, le=MAX_REQUESTS)
    system_prompt_tokens: int = Field(2048, ge=1, le=MAX_TOKENS)
    question_tokens: int = Field(128, ge=1, le=MAX_TOKENS)
    output_tokens: int = Field(256, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _bounded(self) -> GspConfig:
        total = self.groups * self.prompts_per_group
        if total > MAX_REQUESTS:
            raise ValueError(
                f"groups x promptsPerGroup: {total} requests, more than {MAX_REQUESTS}"
            )
        return self


def gsp(config: GspConfig, seed: int, limit: int | None = None) -> tuple[WorkloadRequest, ...]:
    """Every (group, prompt) pair once, shuffled; only the first ``limit`` are built. The
    shuffle permutes pair indexes (``group * prompts_per_group + prompt``): the order depends on
    the count alone, so it is the one a shuffled list of the pairs would have."""
    order = list(range(config.groups * config.prompts_per_group))
    random.Random(seed).shuffle(order)
    out = []
    for index, pair in enumerate(order[:limit]):
        group, prompt = divmod(pair, config.prompts_per_group)
        segments = (
            Segment(_content_id(seed, "gsp-system", group), config.system_prompt_tokens),
            Segment(_content_id(seed, "gsp-question", group, prompt), config.question_tokens),
        )
        out.append(WorkloadRequest(index, 0.0, segments, config.output_tokens))
    return tuple(out)


class MultiRoundQaConfig(StrictModel):
    """LMCache multi-round QA: users x rounds; shared system prompt plus a growing private history.

    User ``u`` sends round ``r`` at ``(u + r * users) / qps`` (so the fleet sees ``qps``); the
    simulator holds a round back until the user's previous round has finished.
    """

    type: Literal["multi-round-qa"] = "multi-round-qa"
    users: int = Field(10, ge=1, le=MAX_REQUESTS)
    rounds: int = Field(5, ge=1, le=MAX_ROUNDS)
    qps: float = Field(0.5, gt=0.0)
    shared_system_prompt_tokens: int = Field(1000, ge=0, le=MAX_TOKENS)
    user_history_prompt_tokens: int = Field(2000, ge=0, le=MAX_TOKENS)
    question_tokens: int = Field(50, ge=1, le=MAX_TOKENS)
    answer_tokens: int = Field(100, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _bounded(self) -> MultiRoundQaConfig:
        total = self.users * self.rounds
        if total > MAX_REQUESTS:
            raise ValueError(f"users x rounds: {total} requests, more than {MAX_REQUESTS}")
        return self


def multi_round_qa(
    config: MultiRoundQaConfig, seed: int, limit: int | None = None
) -> tuple[WorkloadRequest, ...]:
    """In arrival order (round by round, each user in turn), the first ``limit`` requests;
    ``request_id`` numbers them user by user (``user * rounds + round``)."""
    system = Segment(_content_id(seed, "mrq-system"), config.shared_system_prompt_tokens)
    total = config.users * config.rounds
    count = total if limit is None else min(total, limit)
    histories: list[list[Segment]] = []
    out = []
    for position in range(count):
        round_, user = divmod(position, config.users)
        if round_ == 0:
            history: list[Segment] = [system] if system.tokens else []
            if config.user_history_prompt_tokens:
                own = _content_id(seed, "mrq-history", user)
                history.append(Segment(own, config.user_history_prompt_tokens))
            histories.append(history)
        history = histories[user]
        history.append(Segment(_content_id(seed, "mrq-q", user, round_), config.question_tokens))
        arrival_s = (user + round_ * config.users) / config.qps
        index = user * config.rounds + round_
        out.append(
            WorkloadRequest(index, arrival_s, tuple(history), config.answer_tokens, session_id=user)
        )
        history.append(Segment(_content_id(seed, "mrq-a", user, round_), config.answer_tokens))
    return tuple(out)
