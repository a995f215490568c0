"""The codec between the library's types (:mod:`speculant.types`) and their protobuf
messages: the ``*_to_pb`` / ``*_from_pb`` of the services and the gateway (the gateway's own
messages, GenerateRequest and its answers, are converted by its gRPC door,
:mod:`gateway.api.server`).

Drafts: a gateway turns a context and DraftParams into a ProposeRequest
(:func:`propose_request_to_pb`), the draft service reads them back
(:func:`draft_params_from_pb`, unset fields taking its defaults) and answers with a
ProposeResponse (:func:`proposal_to_pb`), which the gateway decodes
(:func:`proposal_from_pb`). A client's DraftOptions are read as the fields it sets
(:func:`draft_fields_from_pb`), which the gateway puts over its defaults. q's travel as
SparseDistribution messages.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, fields, replace

import numpy as np

from speculant.config import DraftParams, SamplingControls, SessionOptions, check_top_logprobs
from speculant.constraint import Constraint
from speculant.errors import InvalidArgumentError
from speculant.types import (
    DraftProposal,
    DraftTarget,
    GraphStatus,
    LiveStats,
    ModelInfo,
    SparseDistribution,
    TokenLogprobs,
    VerifierStats,
    VerifyResult,
)
from speculant.v1 import admin_pb2, common_pb2, draft_pb2, verifier_pb2

# The draft strategy names of speculant.config and their values in the proto enum
STRATEGY_TO_PROTO = {
    "greedy": common_pb2.DRAFT_STRATEGY_GREEDY,
    "sampling": common_pb2.DRAFT_STRATEGY_SAMPLING,
}
STRATEGY_FROM_PROTO = {value: name for name, value in STRATEGY_TO_PROTO.items()}


def sparse_to_pb(dist: SparseDistribution) -> common_pb2.SparseDistribution:
    return common_pb2.SparseDistribution(
        token_ids=dist.token_ids.tolist(), probs=dist.probs.tolist()
    )


# The drafting fields DraftOptions and ProposeRequest carry under DraftParams' names (strategy,
# an enum, apart); draft_size is the gateway's choice, not sent to the draft service.
GATEWAY_SIDE_FIELDS = ("draft_size",)
_OPTION_FIELDS = tuple(f.name for f in fields(DraftParams) if f.name != "strategy")
_PROPOSE_FIELDS = tuple(name for name in _OPTION_FIELDS if name not in GATEWAY_SIDE_FIELDS)


# a request's strategy: unset (None: the receiver's default) or a name
REQUESTED_STRATEGY = {common_pb2.DRAFT_STRATEGY_UNSPECIFIED: None, **STRATEGY_FROM_PROTO}


def _given(message: object, names: Sequence[str]) -> dict[str, object]:
    """{name: value} of the optional fields among `names` that the message sets."""
    return {name: getattr(message, name) for name in names if message.HasField(name)}


def draft_params_from_pb(
    request: draft_pb2.ProposeRequest, defaults: DraftParams
) -> tuple[DraftParams, int | None]:
    """(validated DraftParams, seed or None) from a ProposeRequest; unset fields take defaults."""
    if request.strategy not in REQUESTED_STRATEGY:
        raise InvalidArgumentError("strategy", f"unknown DraftStrategy value {request.strategy}")
    changes = _given(request, _PROPOSE_FIELDS)  # mixing: validated by name in validate()
    for name, value in changes.items():
        if isinstance(value, float) and math.isnan(value):
            raise InvalidArgumentError(name, "must be a number, got NaN")
    if strategy := REQUESTED_STRATEGY[request.strategy]:
        changes["strategy"] = strategy
    params = replace(defaults, **changes) if changes else defaults
    seed = request.seed if request.HasField("seed") else None
    return params.validate(), seed


def propose_params_key(request: draft_pb2.ProposeRequest) -> tuple[object, ...]:
    """What a ProposeRequest's drafting parameters are, as a hashable key: its strategy and the
    value of each optional field it sets (None where unset). Requests with equal keys read
    back to the same DraftParams (a NaN never equals itself, so it never matches a key)."""
    has = request.HasField
    return (
        request.strategy,
        *[getattr(request, name) if has(name) else None for name in _PROPOSE_FIELDS],
    )


def propose_request_to_pb(
    context_ids: Sequence[int],
    params: DraftParams,
    seed: int | None,
    request_id: str = "",
    target: DraftTarget | None = None,
) -> draft_pb2.ProposeRequest:
    """The ProposeRequest for a drafting call (every parameter explicit); request_id: the
    client request it drafts for (see speculant.request_context); target: the graph, tenant
    and pinned build it drafts from (None: the default graph, the default tenant)."""
    target = target or DraftTarget()
    return draft_pb2.ProposeRequest(
        request_id=request_id,
        graph=target.graph,
        tenant=target.tenant,
        graph_id=target.graph_id,
        context_token_ids=context_ids,
        strategy=STRATEGY_TO_PROTO[params.strategy],
        seed=seed,
        **{name: getattr(params, name) for name in _PROPOSE_FIELDS},
    )


def is_greedy_request(request: draft_pb2.ProposeRequest) -> bool:
    return request.strategy == common_pb2.DRAFT_STRATEGY_GREEDY


def proposal_to_pb(proposal: DraftProposal, greedy: bool = False) -> draft_pb2.ProposeResponse:
    """The ProposeResponse carrying a DraftProposal (token ids, q per token, matched orders);
    greedy drafts without their q's (point masses at their tokens, see draft.proto)."""
    response = draft_pb2.ProposeResponse(
        draft_token_ids=proposal.token_ids,
        matched_orders=proposal.matched_orders,
        draft_sources=proposal.sources,
        draft_path_probs=proposal.path_probs,
        draft_parents=proposal.parents,
        draft_seconds=proposal.seconds,
        graph_id=proposal.graph_id,
    )
    for dist in () if greedy else proposal.distributions:
        response.distributions.add(token_ids=dist.token_ids.tolist(), probs=dist.probs.tolist())
    return response


def proposal_from_pb(message: draft_pb2.ProposeResponse, greedy: bool) -> DraftProposal:
    """The DraftProposal in a ProposeResponse. Greedy drafts' q's are point masses at their
    tokens, which the verifier assumes anyway: not decoded (distributions=[])."""
    return DraftProposal(
        token_ids=list(message.draft_token_ids),
        distributions=[] if greedy else [sparse_from_pb(d) for d in message.distributions],
        matched_orders=list(message.matched_orders),
        sources=list(message.draft_sources),
        parents=list(message.draft_parents),
        path_probs=list(message.draft_path_probs),
        seconds=message.draft_seconds,
        graph_id=message.graph_id,
    )


def draft_fields_from_pb(options: common_pb2.DraftOptions) -> dict[str, object]:
    """The drafting fields a request's DraftOptions set, by DraftParams name (``strategy`` as
    its name, e.g. "greedy"); see gateway.engine.RequestDefaults for the defaults of the others."""
    if options.strategy not in REQUESTED_STRATEGY:
        raise InvalidArgumentError("draft.strategy", f"unknown strategy {options.strategy}")
    given = _given(options, _OPTION_FIELDS)
    strategy = REQUESTED_STRATEGY[options.strategy]
    return given if strategy is None else given | {"strategy": strategy}


def sparse_from_pb(dist: common_pb2.SparseDistribution) -> SparseDistribution:
    return SparseDistribution(
        np.asarray(dist.token_ids, dtype=np.int64), np.asarray(dist.probs, dtype=np.float64)
    )


# LiveLayerStats's fields that a LiveStats has (all but the drafting weight)
_LIVE_FIELDS = tuple(
    f.name for f in draft_pb2.LiveLayerStats.DESCRIPTOR.fields if f.name != "weight"
)


def graph_status_to_pb(status: GraphStatus) -> admin_pb2.GraphStatus:
    """One graph of a catalog (draft_service.catalog.GraphStatus) as AdminService reports it."""
    return admin_pb2.GraphStatus(**asdict(status))


def live_stats_to_pb(stats: LiveStats, weight: float) -> draft_pb2.LiveLayerStats:
    return draft_pb2.LiveLayerStats(
        weight=weight, **{name: getattr(stats, name) for name in _LIVE_FIELDS}
    )


def model_info_to_pb(info: ModelInfo) -> verifier_pb2.GetModelInfoResponse:
    return verifier_pb2.GetModelInfoResponse(**asdict(info))


def model_info_from_pb(message: verifier_pb2.GetModelInfoResponse) -> ModelInfo:
    values = {f.name: getattr(message, f.name) for f in fields(ModelInfo)}
    return ModelInfo(
        **{
            **values,
            "eos_token_ids": list(message.eos_token_ids),
            "verify_cost_seconds": list(message.verify_cost_seconds),
        }
    )


def verifier_stats_to_pb(stats: VerifierStats) -> verifier_pb2.GetStatsResponse:
    return verifier_pb2.GetStatsResponse(**asdict(stats))


def verify_result_to_pb(result: VerifyResult) -> verifier_pb2.VerifyResponse:
    return verifier_pb2.VerifyResponse(
        accepted_count=result.accepted_count,
        token_ids=result.token_ids,
        accepted_draft_indices=result.accepted_nodes,
        logprobs=logprobs_to_pb(result.logprobs),
        forward_seconds=result.seconds,
        batch_rows=result.batch_rows,
    )


def verify_result_from_pb(message: verifier_pb2.VerifyResponse) -> VerifyResult:
    return VerifyResult(
        message.accepted_count,
        list(message.token_ids),
        list(message.accepted_draft_indices),
        logprobs_from_pb(message.logprobs),
        message.forward_seconds,
        max(1, message.batch_rows),  # 0: an older server, taken as alone
    )


_CONTROL_FIELDS = tuple(f.name for f in fields(SamplingControls))


def sampling_controls_to_pb(controls: SamplingControls) -> common_pb2.SamplingControls:
    """The controls that are set (unset ones stay unset: the receiver's model defaults)."""
    return common_pb2.SamplingControls(**controls.set_fields())


def sampling_controls_from_pb(message: common_pb2.SamplingControls) -> SamplingControls:
    """The validated controls a message sets (INVALID_ARGUMENT naming a bad field)."""
    values = _given(message, _CONTROL_FIELDS)
    try:
        return SamplingControls(**values).validate()  # type: ignore[arg-type]
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"sampling.{exc.field}", exc.problem) from exc


def optional_top_logprobs(message: object) -> int | None:
    """A request's top_logprobs (None when unset: no logprobs), validated."""
    value = message.top_logprobs if message.HasField("top_logprobs") else None  # type: ignore[attr-defined]
    check_top_logprobs(value)
    return value


def prefill_request_to_pb(
    session_id: str, prompt_ids: Sequence[int], options: SessionOptions
) -> verifier_pb2.PrefillRequest:
    """The PrefillRequest that starts a verifier session (see SessionOptions)."""
    return verifier_pb2.PrefillRequest(
        session_id=session_id,
        prompt_token_ids=prompt_ids,
        temperature=options.temperature,
        seed=options.seed,
        sampling=sampling_controls_to_pb(options.controls),
        top_logprobs=options.top_logprobs,
        constraint=constraint_to_pb(options.constraint),
    )


def session_options_from_pb(request: verifier_pb2.PrefillRequest) -> SessionOptions:
    """A Prefill's session options (unset fields: SessionOptions' defaults), the sampling
    controls and top_logprobs validated."""
    return SessionOptions(
        temperature=request.temperature if request.HasField("temperature") else 1.0,
        controls=sampling_controls_from_pb(request.sampling),
        seed=request.seed if request.HasField("seed") else None,
        top_logprobs=optional_top_logprobs(request),
        constraint=constraint_from_pb(request.constraint),
    )


def constraint_to_pb(constraint: Constraint | None) -> common_pb2.Constraint | None:
    """The Constraint message of a constraint (None: none)."""
    if constraint is None:
        return None
    if constraint.kind == "json_object":
        return common_pb2.Constraint(json_object=True)
    if constraint.kind == "choice":
        return common_pb2.Constraint(choice=common_pb2.Choice(options=constraint.choices))
    return common_pb2.Constraint(**{constraint.kind: constraint.text})


def constraint_from_pb(message: common_pb2.Constraint) -> Constraint | None:
    """A Constraint message as the library's (None when no kind is set, or json_object is
    false), checked (InvalidArgumentError naming the field)."""
    kind = message.WhichOneof("kind")
    if kind is None or (kind == "json_object" and not message.json_object):
        return None
    if kind == "json_object":
        return Constraint("json_object").validate()
    if kind == "choice":
        return Constraint("choice", choices=tuple(message.choice.options)).validate()
    return Constraint(kind, getattr(message, kind)).validate()  # type: ignore[arg-type]


def logprobs_to_pb(logprobs: Sequence[TokenLogprobs]) -> list[common_pb2.TokenLogprob]:
    return [
        common_pb2.TokenLogprob(
            token_id=lp.token_id,
            logprob=lp.logprob,
            top_token_ids=lp.top_token_ids,
            top_logprobs=lp.top_logprobs,
        )
        for lp in logprobs
    ]


def logprobs_from_pb(messages: Sequence[common_pb2.TokenLogprob]) -> list[TokenLogprobs]:
    return [
        TokenLogprobs(m.token_id, m.logprob, tuple(m.top_token_ids), tuple(m.top_logprobs))
        for m in messages
    ]
