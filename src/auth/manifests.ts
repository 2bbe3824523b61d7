/**
 * Resources through gwctl (create -f, get, rm): every kind a manifest can hold, stored by the module that owns
 * it (users.ts, joining.ts, lockadmin.ts) or here (roles, connectors, cluster_maintenance_config), read back
 * without secrets unless asked, and removed by kind and name. Each call is authorized per kind and verb.
 */
import type { Backend } from '../backend/index.js';
import { GatewayError, isGatewayError } from '../errors.js';
import type { AgentDirectory } from './agents.js';
import type { AuditLog } from './audit.js';
import type { CallerCheck } from './callers.js';
import type { Joining } from './joining.js';
import { tokenShortId } from './joining.js';
import type { LockAdmin } from './lockadmin.js';
import type { LockStore } from './locks.js';
import type { Identity } from './pki.js';
import { PRESET_ROLES } from './rbac.js';
import { KEYS, readJson } from './records.js';
import { VERSION } from '../version.js';
import type { RolloutStatus } from '../wire/autoupdate.js';
import { checkVersionResource } from './rollout/safety.js';
import { AUTOUPDATE_AGENT_ROLLOUT_NAME, GET_KINDS, getKindOf, isSingleton, withoutSecrets, type AutoupdateVersion, type GetKind, type LockResource, type Resource, type RoleResource, type TokenResource, type UserResource } from './resources/index.js';
import type { Users } from './users.js';

export interface ManifestsDeps {
  backend: Backend;
  callers: CallerCheck;
  audit: AuditLog;
  users: Users;
  joining: Joining;
  lockAdmin: LockAdmin;
  locks: LockStore;
  agents: AgentDirectory;
  /** The rollout as the controller computed it (autoupdate_agent_rollout, read-only). */
  rollout: { status(): Promise<RolloutStatus> };
}

export interface Stored {
  key: string;
  value: string;
  ttlMs?: number;
  rbacKind: string;
}

export class Manifests {
  constructor(private readonly deps: ManifestsDeps) {}

  /**
   * Creates (or, with overwrite, upserts) every resource of a manifest atomically: either all are stored or none.
   * Returns one confirmation line per resource.
   */
  async createResources(caller: Identity, resources: Resource[], overwrite: boolean): Promise<string[]> {
    const { backend, callers } = this.deps;
    const conditions: Array<{ key: string; exists: false }> = [];
    const ops: Array<{ type: 'put'; key: string; value: string; ttlMs?: number }> = [];
    const messages: string[] = [];
    for (const resource of resources) {
      const { key, value, ttlMs, rbacKind } = await this.storageFor(resource, caller);
      const existing = await backend.get(key);
      await callers.authorize(caller, rbacKind, existing ? 'update' : 'create');
      if (existing && !overwrite) {
        throw new GatewayError('GW_ERR_RESOURCE_EXISTS', `${resource.kind} "${displayName(resource)}" already exists`, { hint: 'Use gwctl create -f to overwrite it.' });
      }
      if (!existing) conditions.push({ key, exists: false });
      ops.push({ type: 'put', key, value, ...(ttlMs === undefined ? {} : { ttlMs }) });
      messages.push(resource.kind === 'cluster_maintenance_config' ? 'maintenance window has been updated' : `${resource.kind} "${displayName(resource)}" has been ${existing ? 'updated' : 'created'}`);
    }
    try {
      await backend.atomicWrite(conditions, ops);
    } catch (err) {
      if (isGatewayError(err, 'GW_ERR_BACKEND_CONFLICT')) {
        throw new GatewayError('GW_ERR_RESOURCE_EXISTS', `a resource in the manifest was created by someone else meanwhile (${String(err.details.key ?? '')})`, {
          hint: 'Run the command again; use -f to overwrite.',
        });
      }
      throw err;
    }
    for (const resource of resources) await this.deps.audit.record(`${resource.kind}.write`, caller, { name: displayName(resource) });
    return messages;
  }

  /**
   * What the module owning the resource's kind stores for it (its key, value and TTL) and the kind its rules
   * name. pendingRoles: roles that the same write creates (gwctl apply), which a user may name.
   */
  async storageFor(resource: Resource, caller: Identity, pendingRoles: ReadonlySet<string> = new Set()): Promise<Stored> {
    switch (resource.kind) {
      case 'lock':
        return { ...this.deps.lockAdmin.fromManifest(caller, resource as LockResource), rbacKind: 'lock' };
      case 'role':
        return { key: KEYS.role(resource.metadata.name), value: JSON.stringify(resource), rbacKind: 'role' };
      case 'user':
        return { ...(await this.deps.users.storedFromManifest(resource as UserResource, pendingRoles)), rbacKind: 'user' };
      case 'token':
        return { ...this.deps.joining.fromManifest(resource as TokenResource), rbacKind: 'token' };
      case 'github':
      case 'saml':
      case 'oidc':
        return { key: KEYS.connector(resource.kind, resource.metadata.name), value: JSON.stringify(resource), rbacKind: resource.kind };
      case 'cluster_maintenance_config':
        return { key: KEYS.maintenance, value: JSON.stringify(resource), rbacKind: 'cluster_maintenance_config' };
      case 'autoupdate_config':
        return { key: KEYS.autoupdateConfig, value: JSON.stringify(resource), rbacKind: 'autoupdate_config' };
      case 'autoupdate_version': {
        // The safety rules refuse what no agent may ever run (src/auth/rollout/safety.ts); the planner holds the rest.
        const agents = (resource as AutoupdateVersion).spec.agents;
        checkVersionResource(agents.start_version, agents.target_version, VERSION);
        return { key: KEYS.autoupdateVersion, value: JSON.stringify(resource), rbacKind: 'autoupdate_version' };
      }
      default:
        throw new GatewayError('GW_ERR_RESOURCE_INVALID', `resources of kind "${resource.kind}" cannot be created with gwctl`);
    }
  }

  /** Reads resources of a kind (all, or one by name; the kind singular or plural). Secrets only with withSecrets. */
  async getResources(caller: Identity, kindText: string, name: string | undefined, withSecrets: boolean): Promise<Resource[]> {
    const kind = knownKind(kindText);
    // A singleton (cluster_maintenance_config, the rollout's kinds): getting it is a read, never a list.
    const singleton = isSingleton(kind) || kind === 'autoupdate_agent_rollout';
    await this.deps.callers.authorize(caller, kind, name === undefined && !singleton ? 'list' : 'read');
    // Tokens are stored hashed: they are listed by id, never by value, so there is nothing more to strip.
    let found = kind === 'token' ? await this.tokenResources() : await this.read(kind);
    if (name !== undefined) {
      found = found.filter((r) => r.metadata.name === name);
      if (found.length === 0) throw new GatewayError('GW_ERR_RESOURCE_NOT_FOUND', `${kind} "${name}" does not exist`, { hint: `List what exists with 'gwctl get ${kind}s'.` });
    }
    return withSecrets || kind === 'token' ? found : found.map((r) => withoutSecrets(r));
  }

  /** Every resource of a kind other than token, unchecked. */
  private async read(kind: Exclude<GetKind, 'token'>): Promise<Resource[]> {
    const { backend } = this.deps;
    switch (kind) {
      case 'role': {
        const stored = (await backend.range('/roles/')).map((i) => JSON.parse(i.value) as RoleResource);
        const names = new Set(stored.map((r) => r.metadata.name));
        return [...PRESET_ROLES.filter((r) => !names.has(r.metadata.name)), ...stored].sort((a, b) => a.metadata.name.localeCompare(b.metadata.name));
      }
      case 'user':
        return this.deps.users.all();
      case 'lock':
        return this.deps.locks.list();
      case 'github':
      case 'saml':
      case 'oidc':
        return (await backend.range(`/connectors/${kind}/`)).map((i) => JSON.parse(i.value) as Resource);
      case 'cluster_maintenance_config': {
        const item = await readJson<Resource>(backend, KEYS.maintenance);
        return item ? [item] : [];
      }
      case 'autoupdate_config':
      case 'autoupdate_version': {
        const item = await readJson<Resource>(backend, kind === 'autoupdate_config' ? KEYS.autoupdateConfig : KEYS.autoupdateVersion);
        return item ? [item] : [];
      }
      case 'autoupdate_agent_rollout': {
        const status = await this.deps.rollout.status();
        return status.managed && status.target_version ? [{ kind, version: 'v1', metadata: { name: AUTOUPDATE_AGENT_ROLLOUT_NAME }, spec: status }] : [];
      }
      case 'event':
        return (await this.deps.audit.list()).map(({ name, event }) => ({ kind: 'event', version: 'v1', metadata: { name }, spec: event }) as unknown as Resource);
      case 'node':
        return this.deps.agents.nodeResources();
      case 'proxy':
        return this.deps.agents.proxyResources();
    }
  }

  private async tokenResources(): Promise<Resource[]> {
    return (await this.deps.joining.stored()).map(
      (t) => ({ kind: 'token', version: 'v2', metadata: { name: t.id, expires: new Date(t.expiresAt).toISOString() }, spec: { roles: t.roles, uses: t.uses, used: t.used } }) as unknown as Resource,
    );
  }

  async removeResource(caller: Identity, kindText: string, name: string): Promise<void> {
    const kind = knownKind(kindText);
    await this.deps.callers.authorize(caller, kind, 'delete');
    let key: string;
    switch (kind) {
      case 'role':
        key = KEYS.role(name);
        break;
      case 'user':
        return this.deps.users.removeUser(caller, name);
      case 'lock':
        await this.deps.lockAdmin.removeLocks(caller, { name });
        return;
      case 'token':
        return this.deps.joining.removeToken(caller, name);
      case 'github':
      case 'saml':
      case 'oidc':
        key = KEYS.connector(kind, name);
        break;
      case 'cluster_maintenance_config':
        key = KEYS.maintenance;
        break;
      case 'autoupdate_config':
        key = KEYS.autoupdateConfig;
        break;
      case 'autoupdate_version':
        key = KEYS.autoupdateVersion;
        break;
      case 'autoupdate_agent_rollout':
        throw new GatewayError('GW_ERR_AUTOUPDATE_READ_ONLY', 'autoupdate_agent_rollout is what the Auth Service computed: it cannot be removed');
      default:
        throw new GatewayError('GW_ERR_RESOURCE_KIND', `resources of kind "${kind}" cannot be removed with gwctl`);
    }
    if (!(await this.deps.backend.delete(key))) throw new GatewayError('GW_ERR_RESOURCE_NOT_FOUND', `${kind} "${name}" does not exist`);
    await this.deps.audit.record(`${kind}.delete`, caller, { name });
  }
}

/** The kind of gwctl get / rm, singular or plural; GW_ERR_RESOURCE_KIND listing the kinds for any other. */
function knownKind(text: string): GetKind {
  const kind = getKindOf(text);
  if (kind === undefined) {
    throw new GatewayError('GW_ERR_RESOURCE_KIND', `unknown resource kind "${text.slice(0, 64)}"`, { hint: `Kinds: ${GET_KINDS.join(', ')} (each also in the plural: roles, proxies, ...).` });
  }
  return kind;
}

function displayName(resource: Resource): string {
  return resource.kind === 'token' ? tokenShortId(resource.metadata.name) : resource.metadata.name;
}
