"""Checks of deploy/ (Dockerfile, compose files, Kubernetes manifests) against the code.

A *bundle* is everything in deploy/, parsed (YAML with ``yaml.safe_load_all``, the Dockerfile as
text). :func:`check_bundle` returns a list of *problems*, one line each, naming the file and
object; an empty list means the manifests agree with the code. Every container that runs
``speculant`` has its arguments parsed by :func:`launcher.cli.build_parser`, so an unknown flag
or a bad value is a problem, and the ports, probes, addresses, paths and environment variable
names are compared across files. Tests mutate a loaded bundle to show each check can fail.
"""

from __future__ import annotations

from tests.deploy_compose import (
    check_compose,
    check_compose_gpu,
    check_dockerfile,
    compose_containers,
    merge_compose,
)
from tests.deploy_k8s import check_k8s, check_kustomization, k8s_pods
from tests.deploy_rules import SERVE_COMMANDS, Bundle, Container, parsed


def check_bundle(bundle: Bundle) -> list[str]:
    """Every problem found in the bundle (empty: all consistent with the code)."""
    problems = check_kustomization(bundle)
    problems += check_k8s(bundle.k8s)
    problems += check_compose(bundle.compose, "docker-compose.yml")
    problems += check_compose(merge_compose(bundle.compose, bundle.compose_gpu), "compose+gpu")
    problems += check_compose_gpu(bundle.compose, bundle.compose_gpu)
    serve_ports = {c.args.port for c in speculant_containers(bundle) if c.command in SERVE_COMMANDS}
    problems += check_dockerfile(bundle.dockerfile, serve_ports)
    return problems


def speculant_containers(bundle: Bundle) -> list[Container]:
    """Every container of the bundle that runs speculant (k8s and both compose views)."""
    containers = [c for _, _, pod_containers in k8s_pods(bundle.k8s) for c in pod_containers]
    containers += compose_containers(bundle.compose, "docker-compose.yml")
    containers += compose_containers(
        merge_compose(bundle.compose, bundle.compose_gpu), "compose+gpu"
    )
    containers = [c for c in containers if c.argv is not None]
    for container in containers:
        parsed(container)
    return containers


# ---- shared rules ----------------------------------------------------------------------------
