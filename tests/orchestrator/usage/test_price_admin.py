"""Staff set a cluster's price per device-hour in Django admin (showback); a negative price is refused."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError

from tests import factories

pytestmark = pytest.mark.django_db


def test_it_shows_the_price_on_the_cluster_page(admin_client):
    cluster = factories.cluster()

    page = admin_client.get(f"/admin/orchestrator/cluster/{cluster.pk}/change/").content.decode()

    assert 'name="price_per_device_hour"' in page and "nothing is billed" in page


def test_a_price_is_kept_and_a_negative_one_refused():
    cluster = factories.cluster()
    cluster.price_per_device_hour = Decimal("2.4000")
    cluster.full_clean()
    cluster.save()
    cluster.refresh_from_db()
    assert cluster.price_per_device_hour == Decimal("2.4000")

    cluster.price_per_device_hour = Decimal("-1")
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        cluster.full_clean()
