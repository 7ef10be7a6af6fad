"""`kubectl apply -k daemonset/` again after fixing an image: the certificate Job is named
after the hami-plugin image it runs (`hami-certs-<hash>`), so a new image gives a new Job
instead of a change to the old one's pod template, which the API server refuses (a Job's
template is immutable). Checked on `kubectl kustomize` of a copy of `daemonset/` whose
`images:` entry is edited as docs/install.md says."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import yaml

from tests.deployment.exercise import certs_job
from tests.deployment.manifests import (
    DAEMONSET,
    Obj,
    hami_container,
    load_all,
    named,
    pod_spec,
    run,
    tool,
)

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def render(tmp_path: Path, name: str, new_name: str, new_tag: str) -> list[Obj]:
    """`kubectl kustomize` of a copy of daemonset/ with the hami-plugin image set."""
    copy = tmp_path / name
    shutil.copytree(DAEMONSET, copy)
    kustomization = yaml.safe_load((copy / "kustomization.yaml").read_text())
    (entry,) = [i for i in kustomization["images"] if i["name"] == "hami-plugin"]
    entry.update(newName=new_name, newTag=new_tag)
    (copy / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return load_all(run([tool("kubectl"), "kustomize", str(copy)]))


def test_the_certificate_job_is_named_after_its_image(tmp_path: Path) -> None:
    default = render(tmp_path, "default", "hami-plugin", "0.1.0")
    again = render(tmp_path, "again", "hami-plugin", "0.1.0")
    registry = render(tmp_path, "registry", "registry.example.com/team/hami-plugin", "0.1.0")
    tag = render(tmp_path, "tag", "hami-plugin", "0.1.1")

    names = [certs_job(objects)["metadata"]["name"] for objects in (default, again, registry, tag)]
    # the same image, the same Job (re-applying changes nothing); another registry or tag,
    # another Job
    assert names[0] == names[1]
    assert len(set(names)) == 3, names
    for name in names:
        assert name.startswith("hami-certs-")
        # a Job's name goes into its pods' job-name label: a DNS label, 63 characters at most
        assert DNS_LABEL.match(name) and len(name) <= 63, name

    job = certs_job(registry)
    image = hami_container(job, "certs")["image"]
    assert image == "registry.example.com/team/hami-plugin:0.1.0"
    # the ConfigMap the name comes from holds that image, so its hash is the image's
    assert named(registry, "ConfigMap", job["metadata"]["name"])["data"] == {"image": image}
    # nothing else is renamed: the CronJob, the ServiceAccount and the roles keep their names
    assert named(registry, "CronJob", "hami-certs")
    assert pod_spec(job)["serviceAccountName"] == "hami-certs"
    assert named(registry, "ServiceAccount", "hami-certs")
    # the Job is otherwise the one certs.yaml writes
    (written,) = [o for o in load_all((DAEMONSET / "certs.yaml").read_text()) if o["kind"] == "Job"]
    assert pod_spec(job) == {
        **pod_spec(written),
        "containers": [{**hami_container(written, "certs"), "image": image}],
    }


def test_a_job_that_cannot_finish_is_ended_and_removed() -> None:
    """An image no node pulls keeps the Job's pod in ImagePullBackOff forever: the deadline
    ends it, and finished Jobs go 10 minutes later, so none of the old names piles up."""
    (job,) = [o for o in load_all((DAEMONSET / "certs.yaml").read_text()) if o["kind"] == "Job"]
    assert 0 < job["spec"]["activeDeadlineSeconds"] <= 3600
    assert 0 < job["spec"]["ttlSecondsAfterFinished"] <= 3600
