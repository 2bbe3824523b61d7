/**
 * `gwctl apply`: the resources of one or more manifests made to be what is stored, as one plan and one write.
 *
 * Order, so that a refused document or a refused write changes nothing:
 *   1. every document of every file is validated by the manifest schema (parseManifest: the checks of gwctl
 *      create, no second validator), the same resource twice across files is refused, and so is more than
 *      MAX_APPLY_RESOURCES;
 *   2. each resource is turned into what its owner module stores (Manifests.storageFor: a lock's expiry in the
 *      past, a user's unknown role are refused here), and the item at its key is read with its revision;
 *   3. with --prune, the stored resources labelled for this apply set and absent from the files are listed;
 *   4. the plan (create / update / unchanged / delete, with a diff) is returned; with dry_run nothing more;
 *   5. otherwise one Backend atomicWrite holds every change, conditioned on each key's revision as read in 2 and
 *      3 (absent keys: on still being absent). Someone else's write in between fails the whole write with
 *      GW_ERR_APPLY_CONFLICT and nothing is applied: there is no "applied midway".
 * Every caller check (read to see the diff, create / update / delete to write) is made in 2 and 3, before 5.
 */
import type { Backend, Condition, WriteOp } from '../backend/index.js';
import { GatewayError, isGatewayError } from '../errors.js';
import type { AuditLog } from './audit.js';
import type { CallerCheck } from './callers.js';
import { LOCKS_PREFIX } from './locks.js';
import type { Manifests, Stored } from './manifests.js';
import type { Identity } from './pki.js';
import { KEYS, type StoredToken, type StoredUser } from './records.js';
import {
  APPLY_SET_NAME,
  MAX_APPLY_RESOURCES,
  canonical,
  inApplySet,
  isSingleton,
  planDiff,
  withApplyLabels,
  type AnyResource,
  type ApplyResult,
  type PlanEntry,
  type Resource,
  type ResourceKind,
} from './resources/index.js';

export interface ApplyDeps {
  backend: Backend;
  callers: CallerCheck;
  audit: AuditLog;
  manifests: Manifests;
}

export interface ApplyOptions {
  dryRun: boolean;
  prune: boolean;
  set: string;
}

/** Where the stored resources of each kind live, for --prune (cluster_maintenance_config is one key). */
const PRUNE_PREFIXES: Readonly<Record<ResourceKind, string>> = {
  role: KEYS.role(''),
  user: KEYS.user(''),
  token: KEYS.token(''),
  github: KEYS.connector('github', ''),
  saml: KEYS.connector('saml', ''),
  oidc: KEYS.connector('oidc', ''),
  cluster_maintenance_config: KEYS.maintenance,
  autoupdate_config: KEYS.autoupdateConfig,
  autoupdate_version: KEYS.autoupdateVersion,
  lock: LOCKS_PREFIX,
};

/** A stored item as the resource a reader sees, minus what the Auth Service sets by itself (compared and shown). */
export function storedView(kind: ResourceKind, value: string): Resource {
  const parsed = JSON.parse(value) as Record<string, unknown>;
  switch (kind) {
    case 'user':
      return (parsed as unknown as StoredUser).resource;
    case 'lock': {
      const { created_at: _at, created_by: _by, ...spec } = parsed.spec as Record<string, unknown>;
      return { ...(parsed as unknown as Resource), spec };
    }
    case 'token': {
      const t = parsed as unknown as StoredToken;
      const metadata = { name: t.id, expires: new Date(t.expiresAt).toISOString(), ...(t.labels ? { labels: t.labels } : {}) };
      return { kind: 'token', version: 'v2', metadata, spec: { roles: t.roles, uses: t.uses } } as unknown as Resource;
    }
    default:
      return parsed as unknown as Resource;
  }
}

interface Change {
  entry: PlanEntry;
  condition: Condition;
  op?: WriteOp;
}

export class Applier {
  constructor(private readonly deps: ApplyDeps) {}

  async apply(caller: Identity, resources: AnyResource[], options: ApplyOptions): Promise<ApplyResult> {
    if (!APPLY_SET_NAME.test(options.set)) {
      throw new GatewayError('GW_ERR_API_BAD_REQUEST', `the apply set name "${options.set.slice(0, 64)}" is not 1-63 lowercase letters, digits, ".", "_" or "-"`, {
        hint: 'Name the set like a label value: --set platform-roles.',
      });
    }
    if (resources.length > MAX_APPLY_RESOURCES) {
      throw new GatewayError('GW_ERR_APPLY_TOO_LARGE', `the manifests hold ${resources.length} resources; one apply takes at most ${MAX_APPLY_RESOURCES}`, {
        details: { resources: resources.length, max: MAX_APPLY_RESOURCES },
      });
    }
    const pendingRoles = new Set(resources.filter((r) => r.kind === 'role').map((r) => r.metadata.name));
    const changes: Change[] = [];
    const keys = new Set<string>();
    for (const resource of resources) {
      const change = await this.planOne(caller, resource, options.set, pendingRoles);
      keys.add(change.condition.key);
      changes.push(change);
    }
    if (options.prune) changes.push(...(await this.planPrune(caller, options.set, keys)));
    const result: ApplyResult = { set: options.set, dry_run: options.dryRun, applied: false, plan: changes.map((c) => c.entry) };
    if (options.dryRun) return result;
    const writes = changes.filter((c) => c.op !== undefined);
    if (writes.length > 0) await this.write(changes.map((c) => c.condition), writes.map((c) => c.op!));
    for (const c of writes) await this.deps.audit.record(`${c.entry.kind}.${c.entry.action === 'delete' ? 'delete' : 'write'}`, caller, { name: c.entry.name, via: 'apply', set: options.set });
    return { ...result, applied: true };
  }

  /** The plan entry of one resource of the files, its condition and its write. */
  private async planOne(caller: Identity, resource: AnyResource, set: string, pendingRoles: ReadonlySet<string>): Promise<Change> {
    const { backend, callers, manifests } = this.deps;
    const kind = resource.kind;
    await callers.authorize(caller, kind, 'read');
    const labelled = withApplyLabels(resource, set);
    const stored = await manifests.storageFor(labelled, caller, pendingRoles);
    const existing = await backend.get(stored.key);
    await callers.authorize(caller, stored.rbacKind, existing ? 'update' : 'create');
    const { value, ttlMs } = kind === 'token' ? tokenStorage(stored, labelled, existing?.value) : stored;
    const after = storedView(kind, value);
    const before = existing ? storedView(kind, existing.value) : undefined;
    const name = after.metadata.name;
    const condition: Condition = existing ? { key: stored.key, revision: existing.revision } : { key: stored.key, exists: false };
    const renewed = kind === 'token' && before !== undefined && before.metadata.expires !== after.metadata.expires && resource.metadata.expires === undefined;
    if (before && !renewed && canonical(comparable(before, resource)) === canonical(comparable(after, resource))) {
      return { entry: { kind, name, action: 'unchanged' }, condition };
    }
    const entry: PlanEntry = { kind, name, action: before ? 'update' : 'create', diff: planDiff(`${kind}/${name}`, before, after) };
    return { entry, condition, op: { type: 'put', key: stored.key, value, ...(ttlMs === undefined ? {} : { ttlMs }) } };
  }

  /** Deletes for the stored members of the set that the files no longer hold. */
  private async planPrune(caller: Identity, set: string, keep: ReadonlySet<string>): Promise<Change[]> {
    const out: Change[] = [];
    for (const [kind, prefix] of Object.entries(PRUNE_PREFIXES) as Array<[ResourceKind, string]>) {
      const items = isSingleton(kind) ? [await this.deps.backend.get(prefix)].filter((i) => i !== undefined) : await this.deps.backend.range(prefix);
      for (const item of items) {
        if (keep.has(item.key)) continue;
        const view = storedView(kind, item.value);
        if (!inApplySet(view, set)) continue;
        await this.deps.callers.authorize(caller, kind, 'delete');
        const name = view.metadata.name;
        out.push({
          entry: { kind, name, action: 'delete', diff: planDiff(`${kind}/${name}`, view, undefined) },
          condition: { key: item.key, revision: item.revision },
          op: { type: 'delete', key: item.key },
        });
      }
    }
    return out;
  }

  private async write(conditions: Condition[], ops: WriteOp[]): Promise<void> {
    try {
      await this.deps.backend.atomicWrite(conditions, ops);
    } catch (err) {
      if (isGatewayError(err, 'GW_ERR_BACKEND_CONFLICT')) {
        throw new GatewayError('GW_ERR_APPLY_CONFLICT', 'a resource of the plan was changed by someone else between the plan and the write; nothing was applied', {
          cause: err,
          details: { key: err.details.key },
        });
      }
      throw err;
    }
  }
}

/**
 * A token as apply stores it: with the set's labels, and, over an existing token, its use count and creation kept
 * (an apply that changes its roles does not hand out its uses again), and its expiry too when the manifest gives
 * none (else every update would push it back by the default lifetime); the TTL moves with the expiry.
 */
function tokenStorage(stored: Stored, labelled: Resource, existing: string | undefined): { value: string; ttlMs?: number } {
  const record = JSON.parse(stored.value) as StoredToken;
  const old = existing === undefined ? undefined : (JSON.parse(existing) as StoredToken);
  // The record's creation time is the Auth Service's now: an expired token (kept a while for its audit) is renewed.
  const keepExpiry = old !== undefined && labelled.metadata.expires === undefined && old.expiresAt > Date.parse(record.createdAt);
  const value = JSON.stringify({
    ...record,
    labels: labelled.metadata.labels,
    ...(old ? { used: old.used, createdAt: old.createdAt, createdBy: old.createdBy } : {}),
    ...(keepExpiry ? { expiresAt: old.expiresAt } : {}),
  });
  const ttlMs = stored.ttlMs === undefined ? undefined : keepExpiry ? stored.ttlMs + (old.expiresAt - record.expiresAt) : stored.ttlMs;
  return { value, ...(ttlMs === undefined ? {} : { ttlMs }) };
}

/** What is compared: a token's expiry only when the manifest gives one (else each apply would push it back). */
function comparable(view: Resource, written: AnyResource): Resource {
  if (view.kind !== 'token' || written.metadata.expires !== undefined) return view;
  const { expires: _e, ...metadata } = view.metadata;
  return { ...view, metadata };
}
