"""plasmid_torch.versions: an adapted distribution missing, unsupported or unparsable is one line
with the pip command."""

import pytest
from packaging.specifiers import SpecifierSet

from plasmid.errors import UsageError
from plasmid_torch.versions import check_supported, installed_version

SUPPORTED = SpecifierSet(">=1.2,<1.3")


def test_a_supported_version_is_returned():
    assert check_supported("pkg", "1.2.5", SUPPORTED, "plasmid-pkg") == "1.2.5"


@pytest.mark.parametrize(("version", "message"), [
    (None, "plasmid-pkg needs pkg, which is not installed; pip install 'pkg<1.3,>=1.2'"),
    ("1.3.0", "pkg 1.3.0 is installed but plasmid-pkg supports pkg<1.3,>=1.2; pip install 'pkg<1.3,>=1.2'"),
    ("not-a-version", "pkg not-a-version is installed but plasmid-pkg supports"),
])
def test_missing_unsupported_or_unparsable_versions_are_one_line(version, message):
    with pytest.raises(UsageError) as caught:
        check_supported("pkg", version, SUPPORTED, "plasmid-pkg")
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_installed_version_reads_the_metadata():
    assert installed_version("pluggy") is not None
    assert installed_version("no-such-distribution-plasmid") is None
