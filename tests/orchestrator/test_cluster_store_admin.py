"""Staff set a cluster's object store in Django admin: the fields, and what a cluster's store may not be."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from orchestrator.objectstore import store as storage
from tests import factories

pytestmark = pytest.mark.django_db


def test_it_shows_the_object_store_fields_on_the_cluster_page(admin_client):
    cluster = factories.cluster()

    page = admin_client.get(f"/admin/orchestrator/cluster/{cluster.pk}/change/").content.decode()

    assert "Object store" in page
    for field in ("store_endpoint", "store_bucket", "store_region", "store_path_style", "store_credentials_file"):
        assert f'name="{field}"' in page
    assert 'name="store_secret' not in page and 'type="password"' not in page  # no field for the secret itself


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"store_endpoint": "http://minio.lab:9000", "store_bucket": "models"}, "together"),
        ({"store_endpoint": "http://minio.lab:9000", "store_bucket": "models", "store_credentials_file": "creds"},
         "absolute path"),
        ({"store_endpoint": "http://minio.lab:9000", "store_bucket": "Bad_Bucket", "store_credentials_file": "/c"},
         "lower-case"),
        ({"store_endpoint": "not a url", "store_bucket": "models", "store_credentials_file": "/c"}, "valid URL"),
    ],
)  # fmt: skip
def test_it_refuses_an_incomplete_or_malformed_store(fields, message):
    cluster = factories.cluster()
    for name, value in fields.items():
        setattr(cluster, name, value)

    with pytest.raises(ValidationError, match=message):
        cluster.full_clean()


def test_a_complete_store_is_accepted_and_its_credentials_file_checked(tmp_path):
    creds = tmp_path / "creds"
    creds.write_text("access_key_id=AKIA1\nsecret_access_key=s\n")
    cluster = factories.cluster()
    cluster.store_endpoint, cluster.store_bucket = "http://minio.lab:9000", "models"
    cluster.store_credentials_file = str(creds)

    cluster.full_clean()

    assert cluster.has_store
    assert storage.credentials_file_problem(str(creds)) == ""
    assert "cannot read" in storage.credentials_file_problem(str(tmp_path / "missing"))
