/**
 * Local users and logging in: users with roles, OS logins and a password hash (scrypt, passwords.ts), and the
 * exchange of a password for short-lived user certificates. Logins are rate limited per (user, source),
 * atomically (ratelimit.ts).
 */
import type { Backend } from '../backend/index.js';
import { GatewayError, isGatewayError } from '../errors.js';
import type { Logger } from '../log.js';
import type { AuditLog } from './audit.js';
import { checkRequestKeys, type Authorities, type CertBundle } from './authorities.js';
import type { CallerCheck } from './callers.js';
import type { LockStore } from './locks.js';
import { checkPasswordPolicy, hashPassword, verifyPassword } from './passwords.js';
import type { Identity } from './pki.js';
import { AttemptLimiter, loginKey, reserveOrRefuse } from './ratelimit.js';
import { allowedLogins, maxSessionTtlMs } from './rbac.js';
import { KEYS, NAME_PATTERN, readJson, type StoredUser } from './records.js';
import type { Traits, UserResource } from './resources/index.js';

export const DEFAULT_USER_CERT_TTL_MS = 12 * 3600_000;
/** Failed logins per (user, source): 5 in 5 minutes (docs/security.md). */
export const LOGIN_LIMIT = { maxFailures: 5, windowMs: 5 * 60_000 } as const;

/** How a user signed in with a password, as the audit log records it. */
export type LoginMethod = 'cli' | 'web';

export interface LoginRequest {
  username: string;
  password: string;
  publicKeyPem: string;
  sshPublicKey: string;
  ttlMs?: number;
  source: string;
}

export interface UsersDeps {
  backend: Backend;
  clock: () => number;
  callers: CallerCheck;
  authorities: Authorities;
  audit: AuditLog;
  locks: LockStore;
  log: Logger;
  /** The longest (and default) lifetime of user certificates. */
  userCertTtlMs?: number;
}

/**
 * A local user's database and Kubernetes traits, given at creation (gwctl users add --db-users, --db-names,
 * --kubernetes-users, --kubernetes-groups).
 */
export interface DatabaseTraits {
  db_users?: string[];
  db_names?: string[];
  kubernetes_users?: string[];
  kubernetes_groups?: string[];
}

/** Database users and names as traits: what a role template can use (no spaces, control characters or braces). */
function checkedDbValues(values: string[], what: string): string[] {
  for (const v of values) {
    if (!/^[^\s\u0000-\u001f\u007f{}*]{1,253}$/.test(v)) throw new GatewayError('GW_ERR_RESOURCE_INVALID', `"${v.slice(0, 64)}" is not a usable ${what} (1 to 253 characters, no spaces, control characters, braces or *)`);
  }
  return values;
}

export class Users {
  private readonly limiter: AttemptLimiter;

  constructor(private readonly deps: UsersDeps) {
    this.limiter = new AttemptLimiter({ ...LOGIN_LIMIT, clock: deps.clock });
  }

  /** dbTraits: the user's db_users and db_names traits (what `{{internal.db_users}}` and `{{internal.db_names}}` read). */
  async addUser(caller: Identity, name: string, roles: string[], password: string, logins: string[] = [], dbTraits: DatabaseTraits = {}): Promise<UserResource> {
    const { backend, callers } = this.deps;
    await callers.authorize(caller, 'user', 'create');
    validateUserName(name);
    await callers.requireRolesExist(roles);
    checkPasswordPolicy(password);
    for (const login of logins) {
      if (!/^[a-z_][a-z0-9_.-]{0,31}$/i.test(login)) throw new GatewayError('GW_ERR_RESOURCE_INVALID', `"${login}" is not an OS login name`);
    }
    const traits: Traits = {
      ...(logins.length > 0 ? { logins } : {}),
      ...(dbTraits.db_users?.length ? { db_users: checkedDbValues(dbTraits.db_users, 'database user') } : {}),
      ...(dbTraits.db_names?.length ? { db_names: checkedDbValues(dbTraits.db_names, 'database name') } : {}),
      ...(dbTraits.kubernetes_users?.length ? { kubernetes_users: checkedDbValues(dbTraits.kubernetes_users, 'Kubernetes user') } : {}),
      ...(dbTraits.kubernetes_groups?.length ? { kubernetes_groups: checkedDbValues(dbTraits.kubernetes_groups, 'Kubernetes group') } : {}),
    };
    const resource: UserResource = { kind: 'user', version: 'v2', metadata: { name }, spec: { roles, ...(Object.keys(traits).length > 0 ? { traits } : {}) } };
    const stored: StoredUser = { resource, passwordHash: await hashPassword(password), createdAt: new Date(this.deps.clock()).toISOString() };
    try {
      await backend.create(KEYS.user(name), JSON.stringify(stored));
    } catch (err) {
      if (isGatewayError(err, 'GW_ERR_BACKEND_EXISTS')) {
        throw new GatewayError('GW_ERR_RESOURCE_EXISTS', `user "${name}" already exists`, {
          hint: `Use 'gwctl users update ${name} --set-roles ...' to change its roles.`,
        });
      }
      throw err;
    }
    await this.deps.audit.record('user.create', caller, { user: name, roles });
    return resource;
  }

  async setUserRoles(caller: Identity, name: string, roles: string[]): Promise<UserResource> {
    const { backend, callers } = this.deps;
    await callers.authorize(caller, 'user', 'update');
    await callers.requireRolesExist(roles);
    const item = await backend.get(KEYS.user(name));
    if (!item) throw new GatewayError('GW_ERR_RESOURCE_NOT_FOUND', `user "${name}" does not exist`);
    const stored = JSON.parse(item.value) as StoredUser;
    stored.resource = { ...stored.resource, spec: { ...stored.resource.spec, roles } };
    await backend.compareAndSwap(KEYS.user(name), item.revision, JSON.stringify(stored));
    await this.deps.audit.record('user.update', caller, { user: name, roles });
    return stored.resource;
  }

  async listUsers(caller: Identity): Promise<UserResource[]> {
    await this.deps.callers.authorize(caller, 'user', 'list');
    return this.all();
  }

  /** Every user, unchecked (callers authorize first). */
  async all(): Promise<UserResource[]> {
    return (await this.deps.backend.range('/users/')).map((i) => (JSON.parse(i.value) as StoredUser).resource);
  }

  async removeUser(caller: Identity, name: string): Promise<void> {
    await this.deps.callers.authorize(caller, 'user', 'delete');
    if (!(await this.deps.backend.delete(KEYS.user(name)))) {
      throw new GatewayError('GW_ERR_RESOURCE_NOT_FOUND', `user "${name}" does not exist`);
    }
    await this.deps.audit.record('user.delete', caller, { user: name });
  }

  /** A user from a manifest as it is stored: an existing user keeps its password hash and creation time. */
  async storedFromManifest(user: UserResource, pendingRoles: ReadonlySet<string> = new Set()): Promise<{ key: string; value: string }> {
    const existing = await readJson<StoredUser>(this.deps.backend, KEYS.user(user.metadata.name));
    const stored: StoredUser = {
      resource: user,
      ...(existing?.passwordHash ? { passwordHash: existing.passwordHash } : {}),
      createdAt: existing?.createdAt ?? new Date(this.deps.clock()).toISOString(),
    };
    await this.deps.callers.requireRolesExist(user.spec.roles.filter((r) => !pendingRoles.has(r)));
    return { key: KEYS.user(user.metadata.name), value: JSON.stringify(stored) };
  }

  /**
   * Checks a local user's password: the one check of the CLI login and the web login, with one limiter. A wrong
   * user name and a wrong password give the same error. Attempts are limited per user and source, atomically:
   * the attempt is reserved before the password check and released only when it succeeds (ratelimit.ts). A
   * locked user (or one holding a locked role) is refused, whatever the password. Returns the user's identity
   * (roles and logins as stored now).
   */
  async authenticate(username: string, password: string, source: string, method: LoginMethod): Promise<Identity> {
    const { audit } = this.deps;
    const reservation = reserveOrRefuse(this.limiter, loginKey(username, source), 'login', { user: username, source }, this.deps.log);
    let stored: StoredUser | undefined;
    let ok: boolean;
    try {
      stored = await readJson<StoredUser>(this.deps.backend, KEYS.user(username));
      ok = await verifyPassword(password, stored?.passwordHash);
    } catch (err) {
      reservation.release();
      throw err;
    }
    if (!ok || !stored) {
      reservation.fail();
      await audit.record('user.login.failure', undefined, { user: username, source, method });
      throw new GatewayError('GW_ERR_AUTH_LOGIN_FAILED', 'invalid user name or password');
    }
    reservation.succeed();
    const roles = stored.resource.spec.roles;
    await this.deps.locks.check({ user: username, roles });
    const logins = allowedLogins(await this.deps.callers.rolesOf(roles), stored.resource.spec.traits ?? {});
    return { kind: 'user', name: username, cluster: this.deps.authorities.clusterName, roles, logins };
  }

  /** The password login of gwsh: short-lived user certificates for the given public key. */
  async login(request: LoginRequest): Promise<CertBundle> {
    const { username, source } = request;
    checkRequestKeys(request.publicKeyPem, request.sshPublicKey);
    const identity = await this.authenticate(username, request.password, source, 'cli');
    const longest = this.deps.userCertTtlMs ?? DEFAULT_USER_CERT_TTL_MS;
    const cap = maxSessionTtlMs(await this.deps.callers.rolesOf(identity.roles)) ?? Infinity;
    const ttlMs = Math.min(request.ttlMs ?? longest, longest, cap);
    const logins = identity.logins ?? [];
    const bundle = await this.deps.authorities.issueBundle('user', {
      identity,
      publicKeyPem: request.publicKeyPem,
      sshPublicKey: request.sshPublicKey,
      ttlMs,
      usage: 'client',
      names: [],
      sshPrincipals: logins.length > 0 ? logins : [`-gw-no-login-${username}`],
    });
    await this.deps.audit.record('user.login', undefined, { user: username, source, roles: identity.roles, method: 'cli' });
    return bundle;
  }
}

function validateUserName(name: string): void {
  if (!NAME_PATTERN.test(name)) {
    throw new GatewayError('GW_ERR_RESOURCE_INVALID', `"${name}" is not a valid user name`, {
      hint: 'User names are 1-128 letters, digits, ".", "_", "@" or "-", starting with a letter or digit.',
    });
  }
}

