"""The identity service's own certificate: renewed on a schedule and handed to gRPC once per change."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from identity_helpers import FakeClock, Pki

from tether.identity.ca import CertificateAuthority, IssuanceSettings, Issuer
from tether.identity.serving import ServingCertificate
from tether.naming import control_plane_identity


def test_renews_at_half_life_and_gives_grpc_each_new_certificate_once(ca_files: Pki, clock: FakeClock) -> None:
    authority = CertificateAuthority(
        Issuer.validated([ca_files.issuer], ca_files.issuer_key, [ca_files.anchor]), IssuanceSettings()
    )

    async def scenario() -> tuple[list[object], list[float]]:
        renewed = asyncio.Event()

        async def sleep(seconds: float) -> None:
            if clock.slept:  # the second wait: the first renewal has happened
                renewed.set()
                await asyncio.Future()
            await clock.sleep(seconds)

        serving = ServingCertificate(control_plane_identity("identity"), clock, sleep)
        serving.renew(authority)
        await serving.issued()
        first_expiry = serving.not_after
        assert first_expiry is not None
        serving.credentials()
        fetched = [serving.fetch()]  # gRPC asks before each handshake: nothing new yet
        task = asyncio.create_task(serving.keep_fresh())
        await renewed.wait()
        task.cancel()
        assert serving.not_after is not None and serving.not_after > first_expiry
        fetched += [serving.fetch(), serving.fetch()]
        return fetched, clock.slept

    fetched, slept = asyncio.run(scenario())
    assert fetched[0] is None and fetched[1] is not None and fetched[2] is None
    assert 12 * 3600 - 60 < slept[0] <= 12 * 3600 + 20  # half of the 24 h (+ skew) life


def test_keeps_the_old_certificate_when_the_issuer_cannot_sign(ca_files: Pki, clock: FakeClock) -> None:
    authority = CertificateAuthority(
        Issuer.validated([ca_files.issuer], ca_files.issuer_key, [ca_files.anchor]), IssuanceSettings()
    )
    serving = ServingCertificate(control_plane_identity("identity"), clock)
    serving.renew(authority)
    before = serving.not_after
    clock.advance(timedelta(days=400))
    serving.renew(authority)
    assert serving.not_after == before
