"""Generated workloads: AWS long context, SGLang generated-shared-prefix, LMCache multi-round QA.

Content ids are derived from seeded hashes of a name, so two requests share a prefix exactly when
the workload says they do, and the same seed gives the same workload.
"""

from __future__ import annotations

import random
from typing import Literal

from pydantic import Field

from warmfleet.core.config import StrictModel
from warmfleet.core.hashing import hash_str
from warmfleet.sim.workloads.base import Segment, WorkloadRequest


def _content_id(seed: int, *parts: object) -> int:
    return hash_str(":".join(str(p) for p in parts), seed)


class AwsLongContextConfig(StrictModel):
    """Groups of requests sharing an 8,000-token prefix, each with a unique question (AWS blog).

    ``groups`` unset: chosen so the groups' prefixes total ``working_set_ratio`` times one
    instance's KV capacity.
    """

    type: Literal["aws-long-context"] = "aws-long-context"
    groups: int | None = Field(None, ge=1)
    working_set_ratio: float = Field(4.0, gt=0.0)
    requests_per_group: float = Field(16.0, gt=0.0)
    requests: int | None = Field(None, ge=1)
    prefix_tokens: int = Field(8000, ge=1)
    question_tokens: int = Field(200, ge=1)
    output_tokens: int = Field(256, ge=1)


def aws_long_context(
    config: AwsLongContextConfig, instance_kv_tokens: int, seed: int
) -> tuple[WorkloadRequest, ...]:
    groups = config.groups or max(
        1, round(config.working_set_ratio * instance_kv_tokens / config.prefix_tokens)
    )
    count = config.requests or max(1, round(groups * config.requests_per_group))
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
    groups: int = Field(64, ge=1)
    prompts_per_group: int = Field(16, ge=1)
    system_prompt_tokens: int = Field(2048, ge=1)
    question_tokens: int = Field(128, ge=1)
    output_tokens: int = Field(256, ge=1)


def gsp(config: GspConfig, seed: int) -> tuple[WorkloadRequest, ...]:
    pairs = [(g, p) for g in range(config.groups) for p in range(config.prompts_per_group)]
    random.Random(seed).shuffle(pairs)
    out = []
    for index, (group, prompt) in enumerate(pairs):
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
    users: int = Field(10, ge=1)
    rounds: int = Field(5, ge=1)
    qps: float = Field(0.5, gt=0.0)
    shared_system_prompt_tokens: int = Field(1000, ge=0)
    user_history_prompt_tokens: int = Field(2000, ge=0)
    question_tokens: int = Field(50, ge=1)
    answer_tokens: int = Field(100, ge=1)


def multi_round_qa(config: MultiRoundQaConfig, seed: int) -> tuple[WorkloadRequest, ...]:
    system = Segment(_content_id(seed, "mrq-system"), config.shared_system_prompt_tokens)
    out = []
    index = 0
    for user in range(config.users):
        history: list[Segment] = [system] if system.tokens else []
        if config.user_history_prompt_tokens:
            history.append(
                Segment(_content_id(seed, "mrq-history", user), config.user_history_prompt_tokens)
            )
        for round_ in range(config.rounds):
            history.append(
                Segment(_content_id(seed, "mrq-q", user, round_), config.question_tokens)
            )
            arrival_s = (user + round_ * config.users) / config.qps
            out.append(
                WorkloadRequest(
                    index, arrival_s, tuple(history), config.answer_tokens, session_id=user
                )
            )
            history.append(Segment(_content_id(seed, "mrq-a", user, round_), config.answer_tokens))
            index += 1
    return tuple(sorted(out, key=lambda r: (r.arrival_s, r.request_id)))
