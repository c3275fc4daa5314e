"""GPU capacity from nodes' allocatable resources, and the MIG catalog it checks profiles against."""
from __future__ import annotations

from typing import Any

import pytest
from cosyvoice_operator import mig
from cosyvoice_operator.capacity import GpuRequest, assess, request_from_spec, tolerates
from cosyvoice_operator.spec import parse_spec

Obj = dict[str, Any]
MIG_1G = "nvidia.com/mig-1g.10gb"


def node(name: str, resources: dict[str, Any], labels: dict[str, str] | None = None, *, ready: bool = True,
         cordoned: bool = False, taints: list[Obj] | None = None) -> Obj:
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", **(labels or {})}},
            "spec": {"unschedulable": cordoned, "taints": taints or []},
            "status": {"allocatable": {"cpu": "32", **resources},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pod(name: str, node_name: str, resource: str, count: int = 1, instance: str = "other",
        phase: str = "Running") -> Obj:
    return {"metadata": {"name": name, "labels": {"app.kubernetes.io/instance": instance}},
            "spec": {"nodeName": node_name, "containers": [{"resources": {"limits": {resource: count}}}]},
            "status": {"phase": phase}}


def ask(replicas: int, resource: str = MIG_1G, **kw: Any) -> GpuRequest:
    kw.setdefault("mig_profile", resource.removeprefix("nvidia.com/mig-") if "mig-" in resource else None)
    kw.setdefault("tolerations", ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},))
    return GpuRequest(resource=resource, replicas=replicas, owner="tts", **kw)


def test_not_enough_slices_names_the_numbers_and_the_nodes() -> None:
    nodes = [node("a", {MIG_1G: "1"}), node("b", {MIG_1G: 1}), node("cpu-1", {})]
    result = assess(ask(4), nodes, [])
    assert (result.status, result.reason) == ("False", "InsufficientCapacity")
    assert result.message == "4 × nvidia.com/mig-1g.10gb requested, 2 allocatable on nodes a, b"


def test_enough_slices() -> None:
    result = assess(ask(2), [node("a", {MIG_1G: 7})], [])
    assert (result.status, result.reason, result.allocatable) == ("True", "Sufficient", 7)


def test_slices_held_by_other_pods_do_not_count_but_our_own_do() -> None:
    nodes = [node("a", {MIG_1G: 2})]
    pods = [pod("x", "a", MIG_1G), pod("ours", "a", MIG_1G, instance="tts"),
            pod("done", "a", MIG_1G, phase="Succeeded"), pod("elsewhere", "b", MIG_1G)]
    assert assess(ask(2), nodes, pods).message == "2 × nvidia.com/mig-1g.10gb requested, 1 allocatable on nodes a"


@pytest.mark.parametrize("bad,why", [
    (node("c", {MIG_1G: 7}, cordoned=True), "c (cordoned)"),
    (node("c", {MIG_1G: 7}, ready=False), "c (not Ready)"),
    (node("c", {MIG_1G: 7}, taints=[{"key": "dedicated", "value": "batch", "effect": "NoSchedule"}]),
     "c (taint dedicated=batch:NoSchedule not tolerated)"),
    (node("c", {MIG_1G: 7}, {"nvidia.com/mig.config.state": "pending"}), "c (MIG reconfiguration pending)"),
    (node("c", {MIG_1G: 7}, {"nvidia.com/mig.config.state": "failed"}), "c (MIG reconfiguration failed)"),
])
def test_nodes_pods_cannot_use_are_excluded_and_explained(bad: Obj, why: str) -> None:
    result = assess(ask(3), [node("a", {MIG_1G: 1}), bad], [])
    assert result.status == "False"
    assert result.message.endswith(f"1 allocatable on nodes a; excluded: {why}")


def test_gpu_taint_is_tolerated_and_prefer_no_schedule_is_ignored() -> None:
    taints = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
              {"key": "spot", "effect": "PreferNoSchedule"}]
    assert assess(ask(1), [node("a", {MIG_1G: 1}, taints=taints)], []).status == "True"


def test_node_selector_limits_the_nodes_counted() -> None:
    nodes = [node("a", {MIG_1G: 4}, {"pool": "tts"}), node("b", {MIG_1G: 4}, {"pool": "batch"})]
    result = assess(ask(6, node_selector={"pool": "tts"}), nodes, [])
    assert result.message == "6 × nvidia.com/mig-1g.10gb requested, 4 allocatable on nodes a"


def test_nothing_advertises_the_resource_says_what_nodes_do_advertise() -> None:
    nodes = [node("a", {"nvidia.com/gpu": 7}, {"nvidia.com/mig.strategy": "single"})]
    result = assess(ask(1), nodes, [])
    assert (result.status, result.reason) == ("False", "NoNodeAdvertisesResource")
    assert "nvidia.com/gpu on a" in result.message
    assert "nodes run MIG strategy single; spec.gpu.migStrategy is mixed" in result.message
    bare = assess(ask(1), [node("cpu", {})], [])
    assert "is the NVIDIA device plugin running?" in bare.message


def test_a_profile_the_observed_gpus_do_not_have_lists_the_valid_ones() -> None:
    nodes = [node("h1", {"nvidia.com/mig-1g.12gb": 7}, {"nvidia.com/gpu.product": "NVIDIA-H100-96GB-HBM3"}),
             node("h2", {}, {"nvidia.com/gpu.product": "NVIDIA-GH200-480GB"})]
    result = assess(ask(1), nodes, [])
    assert (result.status, result.reason) == ("False", "MIGProfileNotOffered")
    assert "1g.10gb does not exist" in result.message
    assert "H100-96GB (nodes h1, h2): 1g.12gb, 1g.24gb, 2g.24gb, 3g.48gb, 4g.48gb, 7g.96gb" in result.message


def test_single_strategy_counts_gpus_on_nodes_labelled_with_the_profile() -> None:
    spec = parse_spec({"gpu": {"migStrategy": "single", "migProfile": "1g.5gb", "product": "NVIDIA-A100-SXM4-40GB"},
                       "replicas": 3})
    request = request_from_spec("tts", spec)
    assert request is not None and request.resource == "nvidia.com/gpu"
    nodes = [node("s1", {"nvidia.com/gpu": 7}, {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"}),
             node("s2", {"nvidia.com/gpu": 3}, {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-2g.10gb"})]
    assert assess(request, nodes, []).message == "3 × nvidia.com/gpu requested, 7 allocatable on nodes s1"
    assert request_from_spec("tts", parse_spec({})) is None


def test_tolerations_follow_kubernetes_matching() -> None:
    taint = {"key": "k", "value": "v", "effect": "NoSchedule"}
    assert tolerates([{"operator": "Exists"}], taint)
    assert tolerates([{"key": "k", "operator": "Exists"}], taint)
    assert tolerates([{"key": "k", "value": "v"}], taint)
    assert not tolerates([{"key": "k", "value": "w"}], taint)
    assert not tolerates([{"key": "k", "operator": "Exists", "effect": "NoExecute"}], taint)


# --- the catalog ----------------------------------------------------------------------------------

@pytest.mark.parametrize("label,family", [
    ("NVIDIA-A100-SXM4-40GB", "A100-40GB"), ("NVIDIA-A100-PCIE-40GB", "A100-40GB"),
    ("NVIDIA-A100-SXM4-80GB", "A100-80GB"), ("NVIDIA-A100-80GB-PCIe", "A100-80GB"),
    ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "A100-40GB"), ("NVIDIA-H100-80GB-HBM3", "H100-80GB"),
    ("NVIDIA-H100-PCIe", "H100-80GB"), ("NVIDIA-H100-96GB-HBM3", "H100-96GB"), ("NVIDIA-GH200-480GB", "H100-96GB"),
    ("NVIDIA-H200", "H200-141GB"), ("H200-141GB", "H200-141GB"), ("NVIDIA-H200-NVL", "H200-141GB"),
    ("NVIDIA-H100-NVL", "H100-94GB"), ("NVIDIA-A30", "A30-24GB"), ("NVIDIA-A30-MIG-1g.6gb", "A30-24GB"),
    ("NVIDIA-B200", "B200-180GB"), ("NVIDIA-GB200", "GB200-189GB"),
    ("NVIDIA-GH200-144GB-HBM3e", "H200-141GB"), ("NVIDIA-H100-PCIe-94GB", "H100-94GB"),
    ("nvidia-h100-nvl", "H100-94GB"),  # labels are matched case-insensitively
    ("NVIDIA-A40", None), ("NVIDIA-L4", None), ("Tesla-T4", None),
])
def test_gpu_products_map_to_catalog_families(label: str, family: str | None) -> None:
    assert mig.gpu_family(label) == family


def _catalog(family: str) -> list[tuple[str, int]]:
    return [(p.name, p.max_instances) for p in mig.CATALOG[family]]


def test_catalog_matches_the_mig_user_guide() -> None:
    """Profiles and per-GPU instance counts as NVIDIA's MIG user guide and mig-parted list them."""
    assert _catalog("A30-24GB") == [("1g.6gb", 4), ("1g.6gb+me", 1), ("2g.12gb", 2), ("2g.12gb+me", 1),
                                    ("4g.24gb", 1)]
    assert _catalog("A100-40GB") == [("1g.5gb", 7), ("1g.5gb+me", 1), ("1g.10gb", 4), ("2g.10gb", 3),
                                     ("3g.20gb", 2), ("4g.20gb", 1), ("7g.40gb", 1)]
    assert mig.CATALOG["A100-80GB"] == mig.CATALOG["H100-80GB"]
    assert mig.valid_profiles("H100-94GB") == ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb",
                                               "7g.94gb"]
    assert mig.valid_profiles("H200-141GB") == ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb",
                                                "4g.71gb", "7g.141gb"]
    assert _catalog("B200-180GB")[:2] == [("1g.23gb", 7), ("1g.23gb+me", 1)]
    assert mig.valid_profiles("GB200-189GB")[-1] == "7g.189gb"
    for profiles in mig.CATALOG.values():
        assert all(p.memory_gb > 0 and 1 <= p.compute_slices <= 7 for p in profiles)
        # one media-extension slice per GPU, and only of a profile that also exists without it
        media = [p for p in profiles if p.name.endswith("+me")]
        assert all(p.max_instances == 1 and p.name.removesuffix("+me") in [q.name for q in profiles] for p in media)
        # the whole-GPU profile is the largest, one instance
        assert profiles[-1].compute_slices in (4, 7) and profiles[-1].max_instances == 1


def test_media_extension_profiles_are_requested_by_the_device_plugins_resource_name() -> None:
    assert mig.resource_name("mixed", "1g.10gb+me") == "nvidia.com/mig-1g.10gb.me"
    assert mig.profile_memory_gb("1g.10gb+me") == 10
    assert mig.profile_error("1g.10gb+me", "NVIDIA-H100-80GB-HBM3") is None
    assert "valid profiles: 1g.6gb, 1g.6gb+me" in mig.profile_error("1g.10gb+me", "NVIDIA-A30")


def test_profile_errors_and_resource_names() -> None:
    assert mig.profile_error("1g.10gb", "NVIDIA-A100-SXM4-40GB") is None
    assert mig.profile_error("1g.12gb", "NVIDIA-L4") is None  # unknown product: not guessed
    assert mig.profile_error("1g.20gb", "NVIDIA-A100-SXM4-40GB") == (
        "MIG profile 1g.20gb does not exist on A100-40GB (NVIDIA-A100-SXM4-40GB); "
        "valid profiles: 1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb")
    assert mig.resource_name("mixed", "2g.20gb") == "nvidia.com/mig-2g.20gb"
    assert mig.resource_name("single", "2g.20gb") == mig.resource_name("none", None) == "nvidia.com/gpu"
    assert mig.single_strategy_product_label("NVIDIA-A100-SXM4-40GB", "3g.20gb") == "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"


def test_a_failed_pod_that_still_lists_a_gpu_does_not_hold_it() -> None:
    """The kubelet releases a terminated pod's devices; a Failed pod left behind (kept for its logs)
    must not make a free slice look taken."""
    nodes = [node("a", {MIG_1G: 2})]
    pods = [pod("crashed", "a", MIG_1G, phase="Failed"), pod("finished", "a", MIG_1G, phase="Succeeded"),
            pod("pending-here", "a", MIG_1G, phase="Pending")]
    result = assess(ask(2), nodes, pods)
    assert (result.status, result.allocatable) == ("False", 1)  # only the Pending pod holds one
    assert result.message == "2 × nvidia.com/mig-1g.10gb requested, 1 allocatable on nodes a"


def test_an_untolerated_no_execute_taint_excludes_the_node() -> None:
    """Pods would be evicted from a NoExecute node as soon as they land, so its slices are not capacity."""
    taint = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}
    result = assess(ask(2), [node("a", {MIG_1G: 1}), node("b", {MIG_1G: 4}, taints=[taint])], [])
    assert (result.status, result.allocatable) == ("False", 1)
    assert result.message.endswith("excluded: b (taint node.kubernetes.io/unreachable=:NoExecute not tolerated)")
    tolerated = ask(2, tolerations=({"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                                     "effect": "NoExecute"},))
    assert assess(tolerated, [node("a", {MIG_1G: 1}), node("b", {MIG_1G: 4}, taints=[taint])], []).allocatable == 5


@pytest.mark.parametrize(("tolerations", "taint", "tolerated"), [
    # a toleration for another key or effect is skipped, and a later one still matches
    ([{"key": "other", "operator": "Exists"}, {"key": "k", "value": "v"}], {"key": "k", "value": "v", "effect": "NoSchedule"}, True),
    ([{"key": "k", "operator": "Exists", "effect": "NoExecute"}, {"key": "k", "operator": "Exists"}],
     {"key": "k", "effect": "NoSchedule"}, True),
    ([{"value": "v"}, {"key": "k", "operator": "Exists"}], {"key": "k", "effect": "NoSchedule"}, True),  # keyless Equal: nothing
    ([{"value": "v"}], {"key": "k", "value": "v", "effect": "NoSchedule"}, False),
    # a taint without a value is tolerated by Equal without a value, not by one with a value
    ([{"key": "k"}], {"key": "k", "effect": "NoSchedule"}, True),
    ([{"key": "k", "value": "v"}], {"key": "k", "effect": "NoSchedule"}, False),
    ([{"key": "k"}], {"key": "k", "value": "v", "effect": "NoSchedule"}, False),
])
def test_toleration_matching_edge_cases(tolerations: list[Obj], taint: Obj, tolerated: bool) -> None:
    assert tolerates(tolerations, taint) is tolerated


def test_a_node_without_conditions_counts_and_nothing_advertised_is_explained() -> None:
    fresh = node("fresh", {MIG_1G: 2})
    del fresh["status"]["conditions"]
    assert assess(ask(2), [fresh], []).status == "True"
    zero = [node("a", {"nvidia.com/gpu": 0, "nvidia.com/mig-2g.20gb": 1}), node("b", {"nvidia.com/gpu": 1}),
            node("c", {"nvidia.com/gpu": 1}, {"nvidia.com/mig.strategy": "mixed"})]
    result = assess(ask(1, mig_profile=None), zero, [])
    assert result.message == ("1 × nvidia.com/mig-1g.10gb requested, 0 allocatable: nodes advertise "
                              "nvidia.com/gpu on b, c; nvidia.com/mig-2g.20gb on a")  # mixed matches: no strategy hint
    single = [node("s", {"nvidia.com/gpu": 2}, {"nvidia.com/mig.strategy": "single"}),
              node("t", {"nvidia.com/gpu": 2}, {"nvidia.com/mig.strategy": "none"})]
    assert assess(ask(1, mig_profile=None), single, []).message.endswith(
        "(nodes run MIG strategy none, single; spec.gpu.migStrategy is mixed)")
    assert "MIG strategy" not in assess(ask(1, mig_profile=None, mig_strategy="none"), single, []).message
    assert assess(ask(1), [node("cpu", {"cpu": "8"})], []).message == (
        "1 × nvidia.com/mig-1g.10gb requested, 0 allocatable: no node advertises an nvidia.com/* resource "
        "(is the NVIDIA device plugin running?)")


def test_request_from_spec_carries_everything_the_count_depends_on() -> None:
    spec = parse_spec({"replicas": 2, "gpu": {"migProfile": "2g.20gb", "migStrategy": "mixed"},
                       "nodeSelector": {"pool": "tts"},
                       "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "tts", "effect": "NoSchedule"}]})
    request = request_from_spec("tts", spec)
    assert request == GpuRequest(
        resource="nvidia.com/mig-2g.20gb", replicas=2, node_selector={"pool": "tts"},
        tolerations=({"key": "dedicated", "operator": "Equal", "value": "tts", "effect": "NoSchedule"},
                     {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}),
        mig_profile="2g.20gb", mig_strategy="mixed", owner="tts")


def test_every_node_and_pod_is_looked_at_whatever_the_order() -> None:
    """Nodes that do not count (no resource, other pool, excluded) and pods that hold nothing here
    come first: the ones after them are still counted."""
    nodes = [node("cpu", {}), node("other-pool", {MIG_1G: 4}, {"pool": "batch"}),
             node("cordoned", {MIG_1G: 4}, {"pool": "tts"}, cordoned=True),
             node("full", {MIG_1G: 2}, {"pool": "tts"}), node("a", {MIG_1G: 3}, {"pool": "tts"})]
    pods = [pod("elsewhere", "b", MIG_1G), pod("ours", "a", MIG_1G, instance="tts"),
            pod("x", "a", MIG_1G), pod("y", "a", MIG_1G),
            {"metadata": {"name": "z", "labels": {}}, "spec": {"nodeName": "full", "containers": [
                {"resources": {"requests": {MIG_1G: 2}}}]}, "status": {"phase": "Running"}}]  # requests only
    result = assess(ask(2, node_selector={"pool": "tts"}), nodes, pods)
    assert (result.status, result.allocatable, result.nodes) == ("False", 1, ("a",))
    assert result.message == "2 × nvidia.com/mig-1g.10gb requested, 1 allocatable on nodes a; excluded: cordoned (cordoned)"
    enough = assess(ask(1, node_selector={"pool": "tts"}), nodes, pods)
    assert (enough.status, enough.allocatable, enough.nodes) == ("True", 1, ("a",))


def test_all_advertising_nodes_excluded_says_so_without_a_node_list() -> None:
    nodes = [node("a", {MIG_1G: 2}, ready=False), {"metadata": {"labels": {}}, "spec": {"unschedulable": True},
                                                   "status": {"allocatable": {MIG_1G: 1}}}]
    result = assess(ask(1), nodes, [])
    assert (result.status, result.reason, result.allocatable, result.nodes) == ("False", "InsufficientCapacity", 0, ())
    assert result.message == "1 × nvidia.com/mig-1g.10gb requested, 0 allocatable; excluded: a (not Ready), ? (cordoned)"
    none = assess(ask(1), [node("cpu", {})], [])
    assert (none.reason, none.allocatable, none.nodes) == ("NoNodeAdvertisesResource", 0, ())


@pytest.mark.parametrize(("state", "excluded"), [("rebooting", True), ("pending", True), ("success", False)])
def test_mig_reconfiguration_matters_only_to_mig_requests(state: str, excluded: bool) -> None:
    n = node("a", {"nvidia.com/gpu": 1}, {"nvidia.com/mig.config.state": state})
    assert (assess(ask(1, resource="nvidia.com/gpu", mig_profile=None), [n], []).status == "False") is excluded
    plain = ask(1, resource="nvidia.com/gpu", mig_profile=None, mig_strategy="none")
    assert assess(plain, [n], []).status == "True"  # a whole GPU without MIG: the MIG manager does not matter


def test_no_strategy_hint_for_a_request_without_mig() -> None:
    single = [node("s", {"nvidia.com/gpu": 2}, {"nvidia.com/mig.strategy": "single"})]
    assert assess(ask(1, mig_profile=None), single, []).message.endswith(
        "(nodes run MIG strategy single; spec.gpu.migStrategy is mixed)")
    plain = ask(1, resource="nvidia.com/mig-1g.10gb", mig_profile=None, mig_strategy="none")
    assert "MIG strategy" not in assess(plain, single, []).message


def test_the_profile_hint_looks_only_at_the_pods_nodes_and_lists_each_family() -> None:
    def gpu_node(name: str, product: str | None, pool: str) -> Obj:
        n = node(name, {"nvidia.com/mig-1g.12gb": 7}, {"pool": pool})
        if product is None:
            del n["metadata"]["labels"]["nvidia.com/gpu.product"]
        else:
            n["metadata"]["labels"]["nvidia.com/gpu.product"] = product
        return n

    nodes = [gpu_node("batch", "NVIDIA-A100-SXM4-80GB", "batch"), gpu_node("unlabelled", None, "tts"),
             gpu_node("h1", "NVIDIA-H100-96GB-HBM3", "tts"), gpu_node("h2", "NVIDIA-H200", "tts")]
    result = assess(ask(1, node_selector={"pool": "tts"}), nodes, [])
    assert (result.status, result.reason) == ("False", "MIGProfileNotOffered")
    assert result.message == (
        "MIG profile 1g.10gb does not exist on the cluster's GPUs; valid profiles: "
        f"H100-96GB (nodes h1): {', '.join(mig.valid_profiles('H100-96GB'))}; "
        f"H200-141GB (nodes h2): {', '.join(mig.valid_profiles('H200-141GB'))}")
    assert assess(ask(1, node_selector={"pool": "batch"}), nodes, []).reason != "MIGProfileNotOffered"


def test_single_strategy_is_carried_from_the_spec() -> None:
    spec = parse_spec({"gpu": {"migStrategy": "single", "migProfile": "3g.40gb", "product": "NVIDIA-A100-SXM4-80GB"}})
    request = request_from_spec("tts", spec)
    assert request is not None and (request.mig_strategy, request.resource) == ("single", "nvidia.com/gpu")
