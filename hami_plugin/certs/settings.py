"""What `hami certs` is configured with, and what each certificate must say: plain values,
light to import (the `hami` parser reads the defaults; `cryptography` loads only when the job
runs)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import timedelta

__all__ = ["CertsSettings", "LeafSpec", "Usage"]


class Usage(enum.StrEnum):
    """What a leaf is for: its one extended key usage."""

    SERVER = "serverAuth"
    CLIENT = "clientAuth"


@dataclass(frozen=True, slots=True)
class LeafSpec:
    """What a leaf must say: its CN, its DNS names (none for a client) and its usage."""

    common_name: str
    dns_names: tuple[str, ...]
    usage: Usage


@dataclass(frozen=True, slots=True)
class CertsSettings:
    """What `hami certs` is configured with (its flags; defaults as there).

    Raises ValueError when a validity does not exceed `renew_before` (every run would issue
    again) or two Secrets share a name.
    """

    namespace: str = "hami-system"
    service: str = "hami-scheduler"
    cluster_domain: str = "cluster.local"
    validity: timedelta = timedelta(days=365)
    ca_validity: timedelta = timedelta(days=3650)
    renew_before: timedelta = timedelta(days=30)
    ca_secret: str = "hami-scheduler-ca"
    tls_secret: str = "hami-scheduler-tls"
    client_secret: str = "hami-kube-scheduler-client"
    booking_key_secret: str = "hami-booking-signing-key"
    """The scheduler's Ed25519 private keys (mounted by the scheduler only)."""
    booking_public_key_secret: str = "hami-booking-public-keys"
    """Their public keys, in the same order (mounted by the device plugins)."""
    webhook_configuration: str = "hami-webhook"
    """Empty: leave every webhook configuration alone."""
    client_common_name: str = "hami-kube-scheduler"
    rotate_booking_key: bool = False
    """Add a new booking key second (step 1 of a rotation)."""
    promote_booking_key: bool = False
    """Make the second booking key the signing one (step 2)."""
    booking_keys_only: bool = False
    """Make and rotate the booking key pair only (certificates made by cert-manager)."""
    require_webhook_configuration: bool = False
    """A missing webhook configuration fails the run (after the Secrets are written), so that
    a Job applied together with it is retried until it exists."""

    def __post_init__(self) -> None:
        if self.renew_before < timedelta(0):
            raise ValueError("--renew-before must not be negative")
        for flag, validity in (("--validity", self.validity), ("--ca-validity", self.ca_validity)):
            if validity <= self.renew_before:
                raise ValueError(
                    f"{flag} ({validity}) must be longer than --renew-before "
                    f"({self.renew_before}): every run would issue again"
                )
        if self.rotate_booking_key and self.promote_booking_key:
            raise ValueError(
                "--rotate-booking-key and --promote-booking-key are two steps: run them apart, "
                "with time between for every pod to read the new key"
            )
        names = [
            self.ca_secret,
            self.tls_secret,
            self.client_secret,
            self.booking_key_secret,
            self.booking_public_key_secret,
        ]
        if len(set(names)) != len(names) or not all(names):
            raise ValueError(f"the five Secret names must be set and differ, got {names}")
        for flag, value in (
            ("--namespace", self.namespace),
            ("--service", self.service),
            ("--cluster-domain", self.cluster_domain),
            ("--client-common-name", self.client_common_name),
        ):
            if not value:
                raise ValueError(f"{flag} must not be empty")

    @property
    def ca_common_name(self) -> str:
        return f"hami-plugin-ca.{self.namespace}"

    @property
    def serving_spec(self) -> LeafSpec:
        """The Service's certificate: its four DNS names, serverAuth."""
        service, namespace = self.service, self.namespace
        names = (
            service,
            f"{service}.{namespace}",
            f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.{self.cluster_domain}",
        )
        return LeafSpec(names[2], names, Usage.SERVER)

    @property
    def client_spec(self) -> LeafSpec:
        """kube-scheduler's client certificate: its CN, clientAuth."""
        return LeafSpec(self.client_common_name, (), Usage.CLIENT)
