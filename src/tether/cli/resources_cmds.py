"""``tether apply``, ``get`` and ``delete``: kubectl's verbs over the local store."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import click

from tether.cli.errors import CliError
from tether.cli.home import store_path
from tether.cli.printing import OUTPUT_FORMATS, echo, render, resource_name
from tether.platform.local import unapplied
from tether.resources.errors import UnknownKind, ValidationError
from tether.resources.kinds import ResourceType, lookup, type_of
from tether.resources.loading import load_path, object_name
from tether.resources.model import parse
from tether.resources.selectors import LabelSelector
from tether.store import Store
from tether.store.errors import CorruptObject, StoreError

DEFAULT_NAMESPACE = "default"

_namespace_opt = click.option("-n", "--namespace", help="The namespace to use (default: default).")


@contextmanager
def _store() -> Iterator[Store]:
    try:
        store = Store(store_path())
    except StoreError as err:
        raise CliError(str(err)) from None
    try:
        yield store
    except StoreError as err:
        raise CliError(str(err)) from None
    finally:
        store.close()


def _load(files: Sequence[str], namespace: str | None) -> list[dict]:
    """Load and validate every document of ``files``; namespaced objects get their namespace."""
    objs: list[dict] = []
    errors: list[str] = []
    for path in files:
        try:
            docs = load_path(path)
        except ValidationError as err:
            errors.append(str(err))
            continue
        for source, index, obj in docs:
            try:
                rtype = type_of(obj)
                meta = obj.setdefault("metadata", {}) if isinstance(obj.get("metadata", {}), dict) else None
                if rtype.namespaced and meta is not None:
                    own = meta.get("namespace")
                    if namespace and own and own != namespace:
                        raise ValidationError(
                            f"the namespace from the provided object {own!r} does not match the namespace "
                            f"{namespace!r}; pass --namespace={own}",
                            source=source, doc_index=index, path="metadata.namespace",
                        )
                    meta.setdefault("namespace", namespace or DEFAULT_NAMESPACE)
                elif meta is not None:
                    meta.pop("namespace", None)  # the API server ignores it on cluster-scoped kinds
                parse(obj, source=source, index=index)
                objs.append(obj)
            except ValidationError as err:
                errors.append(str(err.located(source=source, doc_index=index, name=object_name(obj))))
    if errors:
        raise CliError("\n".join(errors))
    if not objs:
        raise CliError("no objects passed to apply" if files else "must specify one of -f")
    return objs


def _stored_or_none(store: Store, key: tuple[str, str | None, str]) -> dict | None:
    """What ``apply`` compares with: a corrupt stored object counts as absent, since applying replaces it."""
    try:
        return store.get(*key)
    except CorruptObject:
        return None


def _rtype(name: str) -> ResourceType:
    try:
        return lookup(name)
    except UnknownKind as err:
        raise CliError(str(err)) from None


def _key(obj: dict) -> tuple[str, str | None, str]:
    meta = obj["metadata"]
    return type_of(obj).key, meta.get("namespace"), meta["name"]


@click.command()
@click.option("-f", "--filename", "files", multiple=True, required=True,
              help="File, directory (recursively) or - for stdin; may be repeated.")
@_namespace_opt
def apply(files: tuple[str, ...], namespace: str | None) -> None:
    """Create or update resources from files. All documents are stored, or none."""
    objs = _load(files, namespace)
    for obj in objs:
        obj["metadata"].pop("resourceVersion", None)
    with _store() as store:
        before = {_key(o): _stored_or_none(store, _key(o)) for o in objs}
        stored = store.apply_many(objs)
    # An object named twice in one apply is applied twice, in order, as kubectl does: the
    # second is compared with the first (configured or unchanged), not with what was stored before.
    for obj in stored:
        old = before[_key(obj)]
        before[_key(obj)] = obj
        if old is None:
            verb = "created"
        elif old["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]:
            verb = "unchanged"
        else:
            verb = "configured"
        spec = unapplied.pod_spec(obj)
        for field in unapplied.unapplied_fields(spec) if spec is not None else ():
            click.echo(f"Warning: {resource_name(obj)}: {field}", err=True)  # as kubectl prints the API's warnings
        click.echo(f"{resource_name(obj)} {verb}")


@click.command()
@click.argument("kind", required=False)
@click.argument("names", nargs=-1)
@click.option("-f", "--filename", "files", multiple=True, help="Get the objects these files name.")
@_namespace_opt
@click.option("-A", "--all-namespaces", is_flag=True, help="List across all namespaces.")
@click.option("-l", "--selector", help="Label selector, e.g. app=web,tier!=db.")
@click.option("-o", "--output", type=click.Choice(OUTPUT_FORMATS), help="Output format.")
def get(kind: str | None, names: tuple[str, ...], files: tuple[str, ...], namespace: str | None,
        all_namespaces: bool, selector: str | None, output: str | None) -> None:
    """Show resources: KIND [NAME...] or -f FILE, as kubectl get."""
    if bool(kind) == bool(files):
        raise click.UsageError("give either KIND [NAME...] or -f FILE")
    try:
        sel = LabelSelector.parse(selector) if selector else None
    except ValidationError as err:
        raise click.BadParameter(str(err), param_hint="'-l' / '--selector'") from None
    missing: list[str] = []
    unreadable: list[str] = []  # objects whose stored body is corrupt: named, and the rest still shown
    with _store() as store:
        if files:
            wanted = [_key(o) for o in _load(files, namespace)]
            found = []
            for k in wanted:
                try:
                    found.append((k, store.get(*k)))
                except CorruptObject as err:
                    unreadable.append(str(err))
            objs = [o for _, o in found if o is not None]
            missing = [f'{k[0]} "{k[2]}"' for k, o in found if o is None]
            single = len(wanted) == 1
        else:
            rtypes = [_rtype(k) for k in kind.split(",")]
            if names and len(rtypes) > 1:
                raise click.UsageError("names cannot be given with several kinds; use KIND/NAME forms one at a time")
            objs, single = [], len(names) == 1
            for rtype in rtypes:
                ns = None if (all_namespaces or not rtype.namespaced) else (namespace or DEFAULT_NAMESPACE)
                if names:
                    for n in names:
                        try:
                            obj = store.get(rtype.key, ns, n)
                        except CorruptObject as err:
                            unreadable.append(str(err))
                            continue
                        if obj is None:
                            missing.append(f'{rtype.plural} "{n}"')
                        else:
                            objs.append(obj)
                else:
                    listed = store.list(rtype.key, namespace=ns, selector=sel)
                    objs += listed.items
                    unreadable += listed.unreadable
            if not objs and not names and output not in ("json", "yaml"):
                scoped = not all_namespaces and any(r.namespaced for r in rtypes)
                where = f" in {namespace or DEFAULT_NAMESPACE} namespace" if scoped else ""
                click.echo(f"No resources found{where}.", err=True)
    echo(render(objs, output, single, all_namespaces))
    if missing or unreadable:
        raise CliError("\n".join([*(f"{m} not found" for m in missing), *unreadable]))


@click.command()
@click.argument("kind", required=False)
@click.argument("names", nargs=-1)
@click.option("-f", "--filename", "files", multiple=True, help="Delete the objects these files name.")
@_namespace_opt
@click.option("--ignore-not-found", is_flag=True, help="Treat absent objects as deleted.")
def delete(kind: str | None, names: tuple[str, ...], files: tuple[str, ...], namespace: str | None,
           ignore_not_found: bool) -> None:
    """Delete resources: -f FILE or KIND NAME..."""
    if files and kind:
        raise click.UsageError("give either KIND NAME... or -f FILE, not both")
    if files:
        keys = [_key(o) for o in _load(files, namespace)]
    elif kind and names:
        rtype = _rtype(kind)
        ns = (namespace or DEFAULT_NAMESPACE) if rtype.namespaced else None
        keys = [(rtype.key, ns, n) for n in names]
    else:
        raise click.UsageError("give KIND NAME... or -f FILE")
    missing: list[str] = []
    with _store() as store:
        for key in keys:
            gone = store.delete(*key)
            if gone is None:
                missing.append(f'{key[0]} "{key[2]}" not found')
            else:
                click.echo(f'{resource_name(gone)} deleted')
    if missing and not ignore_not_found:
        raise CliError("\n".join(missing))
