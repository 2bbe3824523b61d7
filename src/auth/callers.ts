/**
 * Who is calling, as it stands now, and what they may do: every call made on behalf of someone goes through
 * resolveCaller (still exists, not locked, the certificate's roles that it still has) and authorize (those roles'
 * rules, deny wins) before it touches state. The Backend's watch on locks, users and nodes re-checks what is open
 * in the registry of sessions and closes what no longer passes.
 */
import { watchAcrossGaps, type Backend } from '../backend/index.js';
import { GatewayError } from '../errors.js';
import type { Logger } from '../log.js';
import { LOCKS_PREFIX, type LockStore } from './locks.js';
import type { Identity } from './pki.js';
import { allowedLogins, checkAccess, databaseGrant, kubeGrant, PRESET_ROLES, type Verb } from './rbac.js';
import { KEYS, readJson, type NodeRecord, type StoredUser } from './records.js';
import type { LockResource, RoleResource } from './resources/index.js';
import type { SessionRegistry } from './sessions.js';

/** The refusals that close what an identity has open. */
const REVOCATIONS: ReadonlySet<string> = new Set(['GW_ERR_ACCESS_LOCKED', 'GW_ERR_AUTH_IDENTITY_REVOKED']);

/** Which open sessions a revocation event concerns: one user, every user (a role lock), one agent, or all. */
export type RevocationScope = { kind: 'user'; name: string } | { kind: 'users' } | { kind: 'host'; name: string } | { kind: 'all' };

export function scopeFilter(scope: RevocationScope): (id: Identity) => boolean {
  switch (scope.kind) {
    case 'user':
      return (id) => id.kind === 'user' && id.name === scope.name;
    case 'users':
      return (id) => id.kind === 'user';
    case 'host':
      return (id) => id.kind === 'host' && id.name === scope.name;
    default:
      return () => true;
  }
}

export class CallerCheck {
  constructor(
    private readonly backend: Backend,
    private readonly clusterName: string,
    private readonly locks: LockStore,
    private readonly log: Logger,
  ) {}

  async rolesOf(names: readonly string[]): Promise<RoleResource[]> {
    const roles: RoleResource[] = [];
    for (const name of names) {
      const role = await this.getRole(name);
      if (role) roles.push(role);
    }
    return roles;
  }

  async getRole(name: string): Promise<RoleResource | undefined> {
    const stored = await readJson<RoleResource>(this.backend, KEYS.role(name));
    return stored ?? PRESET_ROLES.find((r) => r.metadata.name === name);
  }

  /** GW_ERR_RESOURCE_NOT_FOUND unless every role exists (stored or preset). */
  async requireRolesExist(roles: string[]): Promise<void> {
    for (const role of roles) {
      if (!(await this.getRole(role))) {
        throw new GatewayError('GW_ERR_RESOURCE_NOT_FOUND', `role "${role}" does not exist`, {
          hint: `Create it first with 'gwctl create role.yaml', or use a preset role: ${PRESET_ROLES.map((r) => r.metadata.name).join(', ')}.`,
        });
      }
    }
  }

  /** A local user's current roles, or undefined when there is no such user. */
  async userRoles(name: string): Promise<string[] | undefined> {
    return (await readJson<StoredUser>(this.backend, KEYS.user(name)))?.resource.spec.roles;
  }

  async getNode(hostId: string): Promise<NodeRecord | undefined> {
    return readJson<NodeRecord>(this.backend, KEYS.node(hostId));
  }

  /**
   * The caller as it stands now: every API request and every new connection the Proxy routes goes through this.
   *
   * - admin (the local admin identity): as is.
   * - user: the stored user must still exist (GW_ERR_AUTH_IDENTITY_REVOKED), and no lock may name the user or a
   *   role it holds, in the certificate or in the stored user (GW_ERR_ACCESS_LOCKED). The roles that count are
   *   those of the certificate that the user still has: a role taken away stops working at once, a role given
   *   works from the next login (certificates are never worth more than when they were issued). The logins
   *   likewise: those of the certificate that the current roles and traits still allow; and the database users and
   *   names they allow (db, for the agent serving a database: rbac.ts databaseGrant).
   * - host: its node record must still exist and no lock may name its host ID.
   */
  async resolveCaller(caller: Identity): Promise<Identity> {
    if (caller.kind === 'admin') return caller;
    if (caller.cluster !== this.clusterName) {
      throw new GatewayError('GW_ERR_ACCESS_DENIED', `identity from cluster "${caller.cluster}" is not valid in "${this.clusterName}"`);
    }
    if (caller.kind === 'host') {
      if (!(await this.getNode(caller.name))) {
        throw new GatewayError('GW_ERR_AUTH_IDENTITY_REVOKED', `agent ${caller.name} is no longer a member of this cluster`, {
          hint: "Join it again with a new token from 'gwctl tokens add'.",
        });
      }
      await this.locks.check({ node: caller.name });
      return caller;
    }
    const stored = await readJson<StoredUser>(this.backend, KEYS.user(caller.name));
    if (!stored) {
      throw new GatewayError('GW_ERR_AUTH_IDENTITY_REVOKED', `user "${caller.name}" no longer exists in this cluster`, {
        hint: 'The user was removed after this certificate was issued; an administrator must create it again, then sign in again.',
      });
    }
    // X.509 and OpenSSH times have whole seconds: a second of slack for a certificate issued just after creation.
    if (caller.issuedAt !== undefined && caller.issuedAt + 1000 < Date.parse(stored.createdAt)) {
      throw new GatewayError('GW_ERR_AUTH_IDENTITY_REVOKED', `user "${caller.name}" was removed and created again after this certificate was issued`, {
        hint: "Sign in again (gwsh login): certificates of the removed user stay refused.",
      });
    }
    const now = stored.resource.spec.roles;
    await this.locks.check({ user: caller.name, roles: [...new Set([...caller.roles, ...now])] });
    const roles = caller.roles.filter((r) => now.includes(r));
    const current = await this.rolesOf(roles);
    const traits = stored.resource.spec.traits ?? {};
    const resolved: Identity = { ...caller, roles, db: databaseGrant(current, traits), kube: kubeGrant(current, traits) };
    if (caller.logins !== undefined) {
      const allowed = new Set(allowedLogins(current, traits));
      resolved.logins = caller.logins.filter((l) => allowed.has(l));
    }
    return resolved;
  }

  /**
   * A user named by an SSH certificate (which carries logins, not roles: the SSH jump host): the same existence
   * and lock checks, with the stored user's roles.
   */
  async resolveSshUser(name: string, issuedAt?: number): Promise<Identity> {
    const roles = (await this.userRoles(name)) ?? [];
    return this.resolveCaller({ kind: 'user', name, cluster: this.clusterName, roles, ...(issuedAt === undefined ? {} : { issuedAt }) });
  }

  /** Why an identity may no longer keep what it has open (a lock, or it was removed), or undefined. */
  async revocationOf(identity: Identity): Promise<GatewayError | undefined> {
    try {
      await this.resolveCaller(identity);
      return undefined;
    } catch (err) {
      if (err instanceof GatewayError && REVOCATIONS.has(err.code)) return err;
      this.log.warn({ err: (err as Error).message, who: identity.name }, 'cannot re-check an identity; its sessions stay open');
      return undefined;
    }
  }

  /**
   * Closes what is open on behalf of identities that a lock or a deletion concerns, as the Backend's watch
   * reports them (a write by this process or, with a shared backend, by any other).
   */
  watchRevocations(sessions: SessionRegistry): void {
    this.watchRevocationScopes((why, scope) => {
      sessions
        .revalidate((id) => this.revocationOf(id), scopeFilter(scope))
        .then((closed) => {
          for (const s of closed) this.log.info({ who: s.identity.name, kind: s.identity.kind, what: s.what, why }, 'session closed: identity revoked');
        })
        .catch((err: unknown) => this.log.warn({ err: (err as Error).message }, 'cannot re-check open sessions'));
    });
  }

  /**
   * Calls onScope with the identities to re-check after every lock, user change or agent removal (a Proxy in
   * its own process gets these over its event stream). Returns the unsubscribe function.
   */
  watchRevocationScopes(onScope: (why: string, scope: RevocationScope) => void): () => void {
    // After a gap in the backend's change log a lock or a removal may have been missed: re-check every session.
    const onGap = (err: Error) => onScope(`watch gap (${err.message})`, { kind: 'all' });
    const locks = watchAcrossGaps(this.backend, LOCKS_PREFIX, (event) => {
      if (event.type !== 'put') return;
      const { target } = (JSON.parse(event.item.value) as LockResource).spec;
      const why = `lock ${event.item.key.slice(LOCKS_PREFIX.length)}`;
      if (target.user !== undefined) onScope(why, { kind: 'user', name: target.user });
      else if (target.role !== undefined) onScope(why, { kind: 'users' });
      else onScope(why, { kind: 'host', name: target.node ?? '' });
    }, onGap);
    const users = watchAcrossGaps(this.backend, '/users/', (event) => {
      const name = (event.type === 'put' ? event.item.key : event.key).slice('/users/'.length);
      onScope(event.type === 'put' ? 'user updated' : 'user removed', { kind: 'user', name });
    }, onGap);
    const nodes = watchAcrossGaps(this.backend, '/nodes/', (event) => {
      if (event.type !== 'delete') return;
      onScope('agent removed', { kind: 'host', name: event.key.slice('/nodes/'.length) });
    }, onGap);
    return () => {
      locks();
      users();
      nodes();
    };
  }


  /**
   * Throws GW_ERR_ACCESS_DENIED unless caller may do at least one of verbs on at least one of resources: the
   * check that runs before a manifest is parsed, when what it holds is not known yet.
   */
  async authorizeAny(caller: Identity, resources: readonly string[], verbs: readonly Verb[]): Promise<void> {
    let first: unknown;
    for (const resource of resources) {
      for (const verb of verbs) {
        try {
          await this.authorize(caller, resource, verb);
          return;
        } catch (err) {
          first ??= err;
        }
      }
    }
    if (!(first instanceof GatewayError) || first.code !== 'GW_ERR_ACCESS_DENIED') throw first;
    throw new GatewayError('GW_ERR_ACCESS_DENIED', `access denied to ${caller.kind === 'user' ? `user "${caller.name}"` : `${caller.kind} identity "${caller.name}"`}: none of its roles allows ${verbs.join(' or ')} on any of ${resources.join(', ')}`, {
      hint: 'Ask an administrator for a role with a rule on the kind you want to write (the request was refused before its body was read).',
      details: { resources: [...resources], verbs: [...verbs] },
    });
  }

  /** Throws GW_ERR_ACCESS_DENIED unless caller (as it stands now: resolveCaller) may do verb on resource. */
  async authorize(caller: Identity, resource: string, verb: Verb): Promise<void> {
    if (caller.kind === 'admin') return;
    if (caller.cluster !== this.clusterName) {
      throw new GatewayError('GW_ERR_ACCESS_DENIED', `identity from cluster "${caller.cluster}" is not valid in "${this.clusterName}"`);
    }
    if (caller.kind !== 'user') {
      throw new GatewayError('GW_ERR_ACCESS_DENIED', `host identities cannot ${verb} ${resource}`);
    }
    const current = await this.resolveCaller(caller);
    const decision = checkAccess(await this.rolesOf(current.roles), resource, verb);
    if (!decision.allowed) {
      throw new GatewayError('GW_ERR_ACCESS_DENIED', `access denied to user "${caller.name}": ${decision.reason}`, {
        hint:
          `Ask an administrator for a role with rules: [{resources: [${decision.missing.resources.join(', ')}], verbs: [${decision.missing.verbs.join(', ')}]}], ` +
          'then sign out and in again (gwsh logout; gwsh login): certificates keep the roles they were issued with.',
        details: { resource, verb, user: caller.name },
      });
    }
  }
}
