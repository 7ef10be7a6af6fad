"""kube-scheduler's PostFilter preemption (`DefaultPreemption`) for the kube-scheduler
stand-in, with an extender that serves the preempt verb and is `nodeCacheCapable`.

Modelled on kube-scheduler v1.24 (files under `pkg/scheduler/` of kubernetes/kubernetes), the
synchronous path; the victim's DisruptionTarget condition is written as v1.26+ writes it
(PodDisruptionConditions), which 1.24 did not:

1. `framework/preemption/preemption.go` `Evaluator.Preempt`: the pod must be eligible
   (`defaultpreemption/default_preemption.go` `PodEligibleToPreemptOthers`: not
   `preemptionPolicy: Never`; no terminating lower-priority pod on its nominated node unless
   that node is UnschedulableAndUnresolvable);
2. `findCandidates`: `nodesWherePreemptionMightHelp` keeps the nodes not
   UnschedulableAndUnresolvable (none left: clear the pod's `nominatedNodeName` and answer
   Unschedulable); `DryRunPreemption` runs `SelectVictimsOnNode`
   (`kubescheduler_fit.select_victims_on_node`) per node; a node that fits with no victim is
   the error "expected at least one victim pod on node ..."; errors with no candidate make
   the status an Error;
3. `callExtenders`: POST `ExtenderPreemptionArgs` with `NodeNameToMetaVictims` to the preempt
   verb (`extender.go` `HTTPExtender.ProcessPreemption`), the answer's UIDs turned back into
   pods on that node (`convertPodUIDToPod`); a node left with no victim is an error (the
   extender is not ignorable);
4. `SelectCandidate` / `pickOneNodeForPreemption`;
5. `prepareCandidate`: per victim the DisruptionTarget condition, DELETE (default
   DeleteOptions: the pod's own grace period) and an Event `Preempted` worded as v1.24's
   ("Preempted by <namespace>/<name> on node <node>"); then the `nominatedNodeName` of
   lower-priority pods nominated to that node is cleared.

`defaultpreemption` prefixes each message with "preemption: ". The caller applies the result:
`nominate` is the pod's new `nominatedNodeName` (`schedule_one.go` `updatePod`: only a
non-None value is written).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.errors import KubeError, NotFound
from hami_plugin.kube.records import ObjectRef
from hami_plugin.testing.kubescheduler_fit import (
    Code,
    NodeState,
    NodeStatus,
    Victims,
    fit_error_message,
    pick_one_node_for_preemption,
    pod_key,
    pod_priority,
    select_victims_on_node,
)

__all__ = [
    "PostFilterResult",
    "PreemptCall",
    "Preemption",
    "PreemptionEvaluator",
    "read_pdbs",
]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]
Post = Callable[[str, str, Mapping[str, Any]], JsonObject]
"""POST a document to (extender URL, "/verb"), its JSON answer; raises on any failure."""

PDB_PATH = "/apis/policy/v1/poddisruptionbudgets"
DISRUPTION_TARGET = "DisruptionTarget"
REASON_PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"


@dataclass(frozen=True, slots=True)
class PostFilterResult:
    """What PostFilter answers: its status, its message (already "preemption: "-prefixed)
    and the preemptor's new `nominatedNodeName` (None: leave it as it is)."""

    code: Code
    message: str
    nominate: str | None = None


@dataclass(frozen=True, slots=True)
class Preemption:
    """A preemption carried out: the preemptor's key, the node, the victims' keys."""

    preemptor: str
    node: str
    victims: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PreemptCall:
    """One POST to the preempt verb: what was sent, what came back (None on failure)."""

    args: JsonObject
    answer: JsonObject | None
    error: str = ""


def read_pdbs(kube: KubeClient) -> list[JsonObject]:
    """Every policy/v1 PodDisruptionBudget (an API server without the resource: none)."""
    try:
        return list(kube.list_objects(PDB_PATH).items)
    except NotFound:
        return []


def _get_ci(document: Mapping[str, Any], name: str) -> Any:
    """A field the way Go's encoding/json finds it: exact name first, else any case."""
    if name in document:
        return document[name]
    for key, value in document.items():
        if isinstance(key, str) and key.lower() == name.lower():
            return value
    return None


@dataclass(slots=True)
class PreemptionEvaluator:
    """`Evaluator.Preempt` against the API server (`kube`) and the extender through `post`
    (`preempt_verb` None: the extender has none). `pdbs` lists the PodDisruptionBudgets."""

    kube: KubeClient
    post: Post
    preempt_verb: str | None
    pdbs: Callable[[], Sequence[Mapping[str, Any]]]
    preemptions: list[Preemption] = field(default_factory=list)
    preempt_calls: list[PreemptCall] = field(default_factory=list)

    def preempt(
        self,
        pod: JsonObject,
        statuses: Mapping[str, NodeStatus],
        nodes: Mapping[str, NodeState],
        now: datetime,
        extender_url: str,
    ) -> PostFilterResult:
        """Run PostFilter for `pod`, which no node fits (`statuses`: why, per node)."""
        result = self._preempt(pod, statuses, nodes, now, extender_url)
        if result.message:
            return PostFilterResult(result.code, "preemption: " + result.message, result.nominate)
        return result

    def _preempt(
        self,
        pod: JsonObject,
        statuses: Mapping[str, NodeStatus],
        nodes: Mapping[str, NodeState],
        now: datetime,
        extender_url: str,
    ) -> PostFilterResult:
        eligible, why = self._eligible(pod, statuses, nodes)
        if not eligible:
            return PostFilterResult(Code.UNSCHEDULABLE, why)
        potential = [
            name
            for name in sorted(nodes)
            if statuses.get(name, NodeStatus(Code.UNSCHEDULABLE, ())).code != Code.UNRESOLVABLE
        ]
        unresolvable = {
            name: NodeStatus(Code.UNRESOLVABLE, ("Preemption is not helpful for scheduling",))
            for name in nodes
            if name not in potential
        }
        if not potential:
            fit = fit_error_message(unresolvable, len(nodes))
            return PostFilterResult(Code.UNSCHEDULABLE, fit, nominate="")
        try:
            pdbs = list(self.pdbs())
        except KubeError as error:
            return PostFilterResult(Code.ERROR, str(error))
        candidates: dict[str, Victims] = {}
        dry_run: dict[str, NodeStatus] = {}
        errors: list[str] = []
        for name in potential:
            victims, reasons = select_victims_on_node(pod, nodes[name], pdbs, now)
            if victims is not None and victims.pods:
                candidates[name] = victims
            elif victims is not None:
                errors.append(f'expected at least one victim pod on node "{name}"')
                dry_run[name] = NodeStatus(Code.ERROR, (errors[-1],))
            else:
                dry_run[name] = NodeStatus(Code.UNSCHEDULABLE, tuple(reasons))
        if not candidates:
            if errors:  # utilerrors.NewAggregate: one error alone, else "[a, b]"
                text = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
                return PostFilterResult(Code.ERROR, text)
            fit = fit_error_message({**dry_run, **unresolvable}, len(nodes))
            return PostFilterResult(Code.UNSCHEDULABLE, fit, nominate="")
        try:
            candidates = self._call_extender(pod, candidates, nodes, extender_url)
        except _PreemptError as error:
            return PostFilterResult(Code.ERROR, str(error))
        best = pick_one_node_for_preemption(candidates, now)
        if not best:
            return PostFilterResult(Code.UNSCHEDULABLE, "no candidate node for preemption")
        error_text = self._prepare_candidate(pod, best, candidates[best], nodes[best], now)
        if error_text:
            return PostFilterResult(Code.ERROR, error_text)
        taken = tuple(pod_key(victim) for victim in candidates[best].pods)
        self.preemptions.append(Preemption(pod_key(pod), best, taken))
        return PostFilterResult(Code.SUCCESS, "", nominate=best)

    @staticmethod
    def _eligible(
        pod: JsonObject, statuses: Mapping[str, NodeStatus], nodes: Mapping[str, NodeState]
    ) -> tuple[bool, str]:
        """`PodEligibleToPreemptOthers` (v1.24)."""
        if (pod.get("spec") or {}).get("preemptionPolicy") == "Never":
            return False, "not eligible due to preemptionPolicy=Never."
        nominated = str((pod.get("status") or {}).get("nominatedNodeName") or "")
        if nominated:
            status = statuses.get(nominated)
            if status is not None and status.code == Code.UNRESOLVABLE:
                return True, ""
            state = nodes.get(nominated)
            for other in state.pods if state is not None else ():
                terminating = (other.get("metadata") or {}).get("deletionTimestamp") is not None
                if terminating and pod_priority(other) < pod_priority(pod):
                    return False, "not eligible due to a terminating pod on the nominated node."
        return True, ""

    def _call_extender(
        self,
        pod: JsonObject,
        candidates: Mapping[str, Victims],
        nodes: Mapping[str, NodeState],
        url: str,
    ) -> dict[str, Victims]:
        """`callExtenders` with one nodeCacheCapable extender that is not ignorable. Raises
        _PreemptError."""
        if self.preempt_verb is None:
            return dict(candidates)
        args: JsonObject = {
            "Pod": pod,
            "NodeNameToMetaVictims": {
                name: {
                    "Pods": [{"UID": (v.get("metadata") or {}).get("uid")} for v in victims.pods],
                    "NumPDBViolations": victims.num_pdb_violations,
                }
                for name, victims in candidates.items()
            },
        }
        try:
            answer = self.post(url, "/" + self.preempt_verb, args)
        except Exception as error:
            self.preempt_calls.append(PreemptCall(args, None, str(error)))
            raise _PreemptError(str(error)) from None
        self.preempt_calls.append(PreemptCall(args, answer))
        chosen: dict[str, Victims] = {}
        for name, meta in (_get_ci(answer, "NodeNameToMetaVictims") or {}).items():
            if name not in nodes:
                raise _PreemptError(f'nodeinfo not found for node name "{name}"')
            on_node = {(p.get("metadata") or {}).get("uid"): p for p in nodes[name].pods}
            pods: list[JsonObject] = []
            for meta_pod in _get_ci(meta or {}, "Pods") or ():
                uid = _get_ci(meta_pod or {}, "UID")
                if uid not in on_node:
                    raise _PreemptError(
                        f"extender: {url} claims to preempt pod (UID: &{{{uid}}}) "
                        f"on node: {name}, but the pod is not found on that node"
                    )
                pods.append(on_node[uid])
            if not pods:
                raise _PreemptError(f'expected at least one victim pod on node "{name}"')
            violations = int(_get_ci(meta or {}, "NumPDBViolations") or 0)
            chosen[name] = Victims(tuple(pods), violations)
        return chosen

    def _prepare_candidate(
        self, pod: JsonObject, node: str, victims: Victims, state: NodeState, now: datetime
    ) -> str:
        """`prepareCandidate`: evict the victims, clear lower nominations. The error, or ""."""
        metadata = pod.get("metadata") or {}
        scheduler = (pod.get("spec") or {}).get("schedulerName") or "default-scheduler"
        for victim in victims.pods:
            namespace, name = pod_key(victim).split("/", 1)
            try:
                self._mark_disruption_target(victim, str(scheduler), now)
                self.kube.delete_pod(namespace, name)
            except NotFound:
                continue
            except KubeError as error:
                logger.warning("stand-in: preempting %s/%s failed: %s", namespace, name, error)
                return str(error)
            victim_meta = victim.get("metadata") or {}
            message = (
                f"Preempted by {metadata.get('namespace') or 'default'}/{metadata.get('name')} "
                f"on node {node}"
            )
            ref = ObjectRef("Pod", namespace, name, str(victim_meta.get("uid") or ""))
            self.kube.create_event(ref, "Preempted", message, "Normal", "default-scheduler")
        for other in state.nominated:
            if pod_priority(other) < pod_priority(pod):
                namespace, name = pod_key(other).split("/", 1)
                try:
                    self.kube.patch_pod_status(namespace, name, {"nominatedNodeName": None})
                except KubeError as error:  # not critical, as in kube-scheduler
                    logger.warning("stand-in: cannot clear nominatedNodeName: %s", error)
        return ""

    def _mark_disruption_target(self, victim: JsonObject, scheduler: str, now: datetime) -> None:
        conditions = [dict(c) for c in (victim.get("status") or {}).get("conditions") or ()]
        wanted = {
            "type": DISRUPTION_TARGET,
            "status": "True",
            "reason": REASON_PREEMPTION_BY_SCHEDULER,
            "message": f"{scheduler}: preempting to accommodate a higher priority pod",
        }
        if any(all(c.get(k) == v for k, v in wanted.items()) for c in conditions):
            return  # UpdatePodCondition: unchanged, nothing written
        conditions = [c for c in conditions if c.get("type") != DISRUPTION_TARGET]
        conditions.append({**wanted, "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ")})
        namespace, name = pod_key(victim).split("/", 1)
        self.kube.patch_pod_status(namespace, name, {"conditions": conditions})


class _PreemptError(Exception):
    """callExtenders failed: the status is an Error."""
