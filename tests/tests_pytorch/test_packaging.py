"""The wheel is ``pytorch-lightning <core>+hpu``, carries only our files, and replaces upstream's cleanly."""

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import lightning
import pytest

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM_ONLY_FILES = ("pytorch_lightning/core/module.py", "lightning_fabric/fabric.py", "pytorch_lightning/_graveyard")


def _pip(python: Path, *args: str, cwd: Path = ROOT) -> None:
    subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args], cwd=cwd, check=True)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    outdir = tmp_path_factory.mktemp("wheel")
    _pip(Path(sys.executable), "wheel", "--no-deps", "--no-build-isolation", "-w", str(outdir), ".")
    (built,) = outdir.glob("*.whl")
    return built


def _metadata(archive: zipfile.ZipFile) -> str:
    (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    return archive.read(name).decode()


@pytest.mark.slow
def test_wheel_name_version_and_contents(wheel):
    with zipfile.ZipFile(wheel) as archive:
        metadata, names = _metadata(archive), archive.namelist()
    assert "Name: pytorch-lightning\n" in metadata
    assert f"Version: {lightning.__version__}+hpu\n" in metadata
    assert "Requires-Dist: lightning==2.6.*" in metadata.replace("lightning ==", "lightning==")

    top_levels = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert {"pytorch_lightning", "lightning_fabric"} <= top_levels
    packages = {path.parent.name for path in (ROOT / "src").glob("*/__init__.py")}
    # besides the packages, the virtual Gaudi's start-up hook, which must sit at the top of site-packages to run
    assert top_levels == packages | {"virtual_hpu_startup.pth"}
    hook = (ROOT / "src" / "virtual_hpu" / "_startup.pth").read_text()
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read("virtual_hpu_startup.pth").decode() == hook
    own_files = {
        str(path.relative_to(ROOT / "src"))
        for path in (ROOT / "src").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and ".egg-info" not in str(path)
    }
    packaged = {name for name in names if name.split("/")[0] in packages}
    assert packaged <= own_files, f"files that are not ours: {sorted(packaged - own_files)}"
    assert not [name for name in names if name.startswith(UPSTREAM_ONLY_FILES)]


@pytest.mark.slow
def test_install_over_upstream_leaves_only_ours(wheel, tmp_path):
    env_dir = tmp_path / "env"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    site_packages = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    # torch and lightning come from the test environment, after the new environment's own packages
    (site_packages / "test_env.pth").write_text("\n".join(p for p in sys.path if p.endswith("site-packages")) + "\n")

    _pip(python, "download", "--no-deps", "-d", str(tmp_path), f"pytorch-lightning=={lightning.__version__}")
    (upstream_wheel,) = tmp_path.glob("pytorch_lightning-*.whl")
    _pip(python, "install", "--no-deps", str(upstream_wheel))
    assert (site_packages / "pytorch_lightning" / "core" / "module.py").exists()

    _pip(python, "install", "--no-deps", str(wheel))
    for upstream_file in UPSTREAM_ONLY_FILES:
        assert not (site_packages / upstream_file).exists(), upstream_file
    listing = subprocess.check_output([str(python), "-m", "pip", "list", "--format=freeze"], text=True)
    ours = [line for line in listing.splitlines() if line.lower().startswith("pytorch-lightning")]
    assert ours == [f"pytorch-lightning=={lightning.__version__}+hpu"]

    script = (
        "import pytorch_lightning as pl, lightning_fabric, lightning.fabric;"
        f"assert pl.__file__.startswith({str(site_packages)!r}), pl.__file__;"
        "assert lightning_fabric.Fabric is lightning.fabric.Fabric;"
        "print(pl.__version__)"
    )
    out = subprocess.check_output([str(python), "-c", script], text=True)
    assert out.strip() == f"{lightning.__version__}+hpu"
