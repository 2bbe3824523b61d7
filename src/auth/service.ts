/**
 * The Auth Service: owns the cluster's identity (name, certificate authorities), its users, roles, join tokens,
 * connectors, locks and cluster_maintenance_config, and signs every certificate. All state is in the Backend;
 * every call made on behalf of someone is checked against that caller as it stands now (resolveCaller: still
 * exists, not locked, the certificate's roles that it still has) and those roles' rules (deny wins) before it
 * touches state. Logins and joins are rate limited atomically (ratelimit.ts); locks and removals close what is
 * open through the registry of sessions (sessions.ts) when the Backend's watch reports them (docs/security.md).
 *
 * Transport-agnostic: api.ts exposes these methods over HTTPS (mutual TLS on 3025, and the public subset on the
 * Proxy's web port).
 */
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { isIP } from 'node:net';
import type { Backend, Item } from '../backend/index.js';
import { GatewayError } from '../errors.js';
import { logger } from '../log.js';
import { VERSION } from '../version.js';
import { hashPassword, verifyPassword, checkPasswordPolicy } from './passwords.js';
import {
  caPin,
  generateAuthority,
  issueSshCert,
  issueTlsCert,
  type CertAuthority,
  type Identity,
} from './pki.js';
import { LOCKS_PREFIX, LockStore, describeTarget, lockKey, targetOf } from './locks.js';
import { loadPublicKey, sshPublicKeyFromPem } from './pki/keys.js';
import { blobFromLine, keyFromBlob } from './pki/sshwire.js';
import { AttemptLimiter, loginKey, type Reservation } from './ratelimit.js';
import { allowedLogins, canAccess, checkAccess, PRESET_ROLES, type AccessKind, type Verb } from './rbac.js';
import {
  tokenId as resourceTokenId,
  withoutSecrets,
  type LockResource,
  type LockTarget,
  type Resource,
  type RoleResource,
  type TokenResource,
  type UserResource,
} from './resources/index.js';
import { SessionRegistry } from './sessions.js';

export const JOIN_ROLES = ['node', 'db', 'app', 'kube', 'desktop', 'proxy'] as const;
export type JoinRole = (typeof JOIN_ROLES)[number];

export const DEFAULT_USER_CERT_TTL_MS = 12 * 3600_000;
export const HOST_CERT_TTL_MS = 365 * 24 * 3600_000;
export const DEFAULT_TOKEN_TTL_MS = 30 * 60_000;
const MAX_TOKEN_TTL_MS = 7 * 24 * 3600_000;

/** Failed logins per (user, source): 5 in 5 minutes (docs/security.md). */
export const LOGIN_LIMIT = { maxFailures: 5, windowMs: 5 * 60_000 } as const;
/** Failed joins (unknown, expired, used-up or wrong-type token) per source: 10 in 10 minutes. */
export const JOIN_LIMIT = { maxFailures: 10, windowMs: 10 * 60_000 } as const;

const TOKEN_FAILURES: ReadonlySet<string> = new Set(['GW_ERR_AUTH_TOKEN_UNKNOWN', 'GW_ERR_AUTH_TOKEN_EXPIRED', 'GW_ERR_AUTH_TOKEN_USED', 'GW_ERR_AUTH_TOKEN_WRONG_TYPE']);
/** The refusals that close what an identity has open. */
const REVOCATIONS: ReadonlySet<string> = new Set(['GW_ERR_ACCESS_LOCKED', 'GW_ERR_AUTH_IDENTITY_REVOKED']);

const KEYS = {
  clusterName: '/cluster/name',
  authority: (type: 'host' | 'user') => `/authorities/${type}`,
  user: (name: string) => `/users/${name}`,
  role: (name: string) => `/roles/${name}`,
  token: (id: string) => `/tokens/${id}`,
  connector: (kind: string, name: string) => `/connectors/${kind}/${name}`,
  maintenance: '/cluster_maintenance_config',
  node: (hostId: string) => `/nodes/${hostId}`,
  presence: (hostId: string) => `/presence/${hostId}`,
  event: (time: number) => `/events/${String(time).padStart(15, '0')}-${randomBytes(4).toString('hex')}`,
};

interface StoredUser {
  resource: UserResource;
  passwordHash?: string;
  createdAt: string;
}

interface StoredToken {
  id: string;
  roles: JoinRole[];
  expiresAt: number;
  /** 0 = unlimited until expiry. */
  uses: number;
  used: number;
  createdAt: string;
  createdBy: string;
  labels?: Record<string, string>;
}

/** What an agent sends to join (token, types, names, keys) and where it came from. */
export interface HostRequest {
  token: string;
  roles: JoinRole[];
  nodename: string;
  publicAddrs: string[];
  publicKeyPem: string;
  sshPublicKey: string;
  source: string;
}

export interface NodeRecord {
  hostId: string;
  nodename: string;
  roles: JoinRole[];
  publicAddrs: string[];
  joinedAt: string;
  source?: string;
  /** The SSH public key its host certificate certifies: what it must authenticate its reverse tunnel with. */
  sshPublicKey?: string;
}

export interface InventoryItem {
  name: string;
  labels: Record<string, string>;
  agent: string;
  host_id: string;
  connected_since: string;
  protocol?: string;
  public_addr?: string;
  /** Nodes: the SSH host certificate, for gwsh known-hosts. */
  host_cert?: string;
}

/** An agent connected to a proxy right now (written by the proxy's tunnel registry, expires unless refreshed). */
export interface Presence {
  hostId: string;
  nodename: string;
  proxyId: string;
  services: string[];
  resources: import('../tunnel/protocol.js').AgentResources;
  connectedAt: string;
  lastHeartbeat: string;
}

export interface CertBundle {
  /** PEM, X.509. */
  tlsCert: string;
  /** OpenSSH certificate line. */
  sshCert: string;
  /** Host CA certificate (PEM): what servers of this cluster present. */
  hostCaPem: string;
  /** User CA certificate (PEM): what clients of this cluster present. */
  userCaPem: string;
  /** SSH CA public keys. */
  sshHostCa: string;
  sshUserCa: string;
  clusterName: string;
  validUntil: string;
}

export interface PublicCas {
  cluster_name: string;
  host_ca: string;
  user_ca: string;
  ssh_host_ca: string;
  ssh_user_ca: string;
}

export interface AuthServiceOptions {
  backend: Backend;
  clusterName: string;
  clock?: () => number;
  userCertTtlMs?: number;
  /** What `gwctl tokens add` prints as --proxy: the first proxy public address, if the proxy runs here. */
  proxyPublicAddr?: string;
}

const ADMIN: Identity = { kind: 'admin', name: 'admin', cluster: '', roles: [] };

function tokenId(token: string): string {
  return createHash('sha256').update(token, 'utf8').digest('hex');
}

/** The short, non-secret form of a token that logs, `gwctl tokens ls` and `rm` use (the resources' token id). */
export const tokenShortId = resourceTokenId;

function parseJson<T>(item: Item | undefined): T | undefined {
  return item === undefined ? undefined : (JSON.parse(item.value) as T);
}

export class AuthService {
  private readonly log = logger('auth');
  private readonly loginLimiter: AttemptLimiter;
  private readonly joinLimiter: AttemptLimiter;
  private readonly locks: LockStore;
  private readonly clock: () => number;
  /** What is open on behalf of identities in this process; closed on lock or deletion (docs/security.md). */
  readonly sessions = new SessionRegistry();

  private constructor(
    private readonly backend: Backend,
    readonly clusterName: string,
    readonly host: CertAuthority,
    readonly user: CertAuthority,
    private readonly options: AuthServiceOptions,
  ) {
    this.clock = options.clock ?? Date.now;
    this.loginLimiter = new AttemptLimiter({ ...LOGIN_LIMIT, clock: this.clock });
    this.joinLimiter = new AttemptLimiter({ ...JOIN_LIMIT, clock: this.clock });
    this.locks = new LockStore(backend, this.clock);
  }

  /** Opens the cluster's state, creating the name and the authorities on first start. */
  static async open(options: AuthServiceOptions): Promise<AuthService> {
    const { backend } = options;
    const stored = parseJson<{ name: string }>(await backend.get(KEYS.clusterName));
    if (stored && stored.name !== options.clusterName) {
      throw new GatewayError(
        'GW_ERR_AUTH_CLUSTER_NAME',
        `the data directory belongs to cluster "${stored.name}", but the configuration names it "${options.clusterName}"`,
        { hint: `A cluster cannot be renamed: set auth_service.cluster_name to "${stored.name}", or use a new data directory.` },
      );
    }
    const authorities: Partial<Record<'host' | 'user', CertAuthority>> = {};
    for (const type of ['host', 'user'] as const) {
      let ca = parseJson<CertAuthority>(await backend.get(KEYS.authority(type)));
      if (!ca) {
        ca = await generateAuthority(type, options.clusterName, options.clock ? { clock: options.clock } : {});
        try {
          await backend.create(KEYS.authority(type), JSON.stringify(ca));
        } catch (err) {
          // Another auth server on a shared backend won the race: use its authority.
          if (!(err instanceof GatewayError && err.code === 'GW_ERR_BACKEND_EXISTS')) throw err;
          ca = parseJson<CertAuthority>(await backend.get(KEYS.authority(type)))!;
        }
      }
      authorities[type] = ca;
    }
    if (!stored) {
      try {
        await backend.create(KEYS.clusterName, JSON.stringify({ name: options.clusterName }));
      } catch (err) {
        if (!(err instanceof GatewayError && err.code === 'GW_ERR_BACKEND_EXISTS')) throw err;
      }
    }
    const service = new AuthService(backend, options.clusterName, authorities.host!, authorities.user!, options);
    service.watchRevocations();
    service.log.info({ cluster: options.clusterName, ca_pin: service.caPin() }, 'auth service ready');
    return service;
  }

  caPin(): string {
    return caPin(this.host.tls.certPem);
  }

  publicCas(): PublicCas {
    return {
      cluster_name: this.clusterName,
      host_ca: this.host.tls.certPem,
      user_ca: this.user.tls.certPem,
      ssh_host_ca: this.host.ssh.publicKey,
      ssh_user_ca: this.user.ssh.publicKey,
    };
  }

  /** The local admin identity (full permissions), for gwctl on the Auth Service's own machine. */
  adminIdentity(): Identity {
    return { ...ADMIN, cluster: this.clusterName };
  }

  // --- certificates for this process's own servers -----------------------------------------------------------------

  async issueServerCert(publicKeyPem: string, names: string[], hostId = 'auth'): Promise<string> {
    const { dnsNames, ipAddresses } = splitNames(names);
    return issueTlsCert(this.host, {
      publicKeyPem,
      identity: { kind: 'host', name: hostId, cluster: this.clusterName, roles: ['auth', 'proxy'] },
      dnsNames,
      ipAddresses,
      ttlMs: HOST_CERT_TTL_MS,
      usage: 'both',
      ...(this.options.clock ? { clock: this.options.clock } : {}),
    });
  }

  async issueAdminCert(publicKeyPem: string): Promise<string> {
    return issueTlsCert(this.user, {
      publicKeyPem,
      identity: this.adminIdentity(),
      ttlMs: HOST_CERT_TTL_MS,
      usage: 'client',
      ...(this.options.clock ? { clock: this.options.clock } : {}),
    });
  }

  // --- access control ---------------------------------------------------------------------------------------------

  async rolesOf(names: readonly string[]): Promise<RoleResource[]> {
    const roles: RoleResource[] = [];
    for (const name of names) {
      const role = await this.getRole(name);
      if (role) roles.push(role);
    }
    return roles;
  }

  private async getRole(name: string): Promise<RoleResource | undefined> {
    const stored = parseJson<RoleResource>(await this.backend.get(KEYS.role(name)));
    return stored ?? PRESET_ROLES.find((r) => r.metadata.name === name);
  }

  /**
   * The caller as it stands now: every API request and every new connection the Proxy routes goes through this.
   *
   * - admin (the local admin identity): as is.
   * - user: the stored user must still exist (GW_ERR_AUTH_IDENTITY_REVOKED), and no lock may name the user or a
   *   role it holds, in the certificate or in the stored user (GW_ERR_ACCESS_LOCKED). The roles that count are
   *   those of the certificate that the user still has: a role taken away stops working at once, a role given
   *   works from the next login (certificates are never worth more than when they were issued). The logins
   *   likewise: those of the certificate that the current roles and traits still allow.
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
    const stored = parseJson<StoredUser>(await this.backend.get(KEYS.user(caller.name)));
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
    const resolved: Identity = { ...caller, roles };
    if (caller.logins !== undefined) {
      const allowed = new Set(allowedLogins(await this.rolesOf(roles), stored.resource.spec.traits ?? {}));
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
  private watchRevocations(): void {
    const recheck = (why: string, filter: (id: Identity) => boolean) => {
      this.sessions
        .revalidate((id) => this.revocationOf(id), filter)
        .then((closed) => {
          for (const s of closed) this.log.info({ who: s.identity.name, kind: s.identity.kind, what: s.what, why }, 'session closed: identity revoked');
        })
        .catch((err: unknown) => this.log.warn({ err: (err as Error).message }, 'cannot re-check open sessions'));
    };
    this.backend.watch(LOCKS_PREFIX, (event) => {
      if (event.type !== 'put') return;
      const { target } = (JSON.parse(event.item.value) as LockResource).spec;
      const why = `lock ${event.item.key.slice(LOCKS_PREFIX.length)}`;
      if (target.user !== undefined) recheck(why, (id) => id.kind === 'user' && id.name === target.user);
      else if (target.role !== undefined) recheck(why, (id) => id.kind === 'user');
      else recheck(why, (id) => id.kind === 'host' && id.name === target.node);
    });
    this.backend.watch('/users/', (event) => {
      const name = (event.type === 'put' ? event.item.key : event.key).slice('/users/'.length);
      recheck(event.type === 'put' ? 'user updated' : 'user removed', (id) => id.kind === 'user' && id.name === name);
    });
    this.backend.watch('/nodes/', (event) => {
      if (event.type !== 'delete') return;
      const hostId = event.key.slice('/nodes/'.length);
      recheck('agent removed', (id) => id.kind === 'host' && id.name === hostId);
    });
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

  // --- users and login ---------------------------------------------------------------------------------------------

  async addUser(caller: Identity, name: string, roles: string[], password: string, logins: string[] = []): Promise<UserResource> {
    await this.authorize(caller, 'user', 'create');
    validateUserName(name);
    await this.requireRolesExist(roles);
    checkPasswordPolicy(password);
    for (const login of logins) {
      if (!/^[a-z_][a-z0-9_.-]{0,31}$/i.test(login)) throw new GatewayError('GW_ERR_RESOURCE_INVALID', `"${login}" is not an OS login name`);
    }
    const resource: UserResource = { kind: 'user', version: 'v2', metadata: { name }, spec: { roles, ...(logins.length > 0 ? { traits: { logins } } : {}) } };
    const stored: StoredUser = { resource, passwordHash: await hashPassword(password), createdAt: new Date(this.clock()).toISOString() };
    try {
      await this.backend.create(KEYS.user(name), JSON.stringify(stored));
    } catch (err) {
      if (err instanceof GatewayError && err.code === 'GW_ERR_BACKEND_EXISTS') {
        throw new GatewayError('GW_ERR_RESOURCE_EXISTS', `user "${name}" already exists`, {
          hint: `Use 'gwctl users update ${name} --set-roles ...' to change its roles.`,
        });
      }
      throw err;
    }
    await this.audit('user.create', caller, { user: name, roles });
    return resource;
  }

  async setUserRoles(caller: Identity, name: string, roles: string[]): Promise<UserResource> {
    await this.authorize(caller, 'user', 'update');
    await this.requireRolesExist(roles);
    const item = await this.backend.get(KEYS.user(name));
    if (!item) throw new GatewayError('GW_ERR_RESOURCE_NOT_FOUND', `user "${name}" does not exist`);
    const stored = JSON.parse(item.value) as StoredUser;
    stored.resource = { ...stored.resource, spec: { ...stored.resource.spec, roles } };
    await this.backend.compareAndSwap(KEYS.user(name), item.revision, JSON.stringify(stored));
    await this.audit('user.update', caller, { user: name, roles });
    return stored.resource;
  }

  /** A local user's current roles, or undefined when there is no such user. */
  async userRoles(name: string): Promise<string[] | undefined> {
    return parseJson<StoredUser>(await this.backend.get(KEYS.user(name)))?.resource.spec.roles;
  }

  async listUsers(caller: Identity): Promise<UserResource[]> {
    await this.authorize(caller, 'user', 'list');
    return (await this.backend.range('/users/')).map((i) => (JSON.parse(i.value) as StoredUser).resource);
  }

  async removeUser(caller: Identity, name: string): Promise<void> {
    await this.authorize(caller, 'user', 'delete');
    if (!(await this.backend.delete(KEYS.user(name)))) {
      throw new GatewayError('GW_ERR_RESOURCE_NOT_FOUND', `user "${name}" does not exist`);
    }
    await this.audit('user.delete', caller, { user: name });
  }

  private async requireRolesExist(roles: string[]): Promise<void> {
    for (const role of roles) {
      if (!(await this.getRole(role))) {
        throw new GatewayError('GW_ERR_RESOURCE_NOT_FOUND', `role "${role}" does not exist`, {
          hint: `Create it first with 'gwctl create role.yaml', or use a preset role: ${PRESET_ROLES.map((r) => r.metadata.name).join(', ')}.`,
        });
      }
    }
  }

  /**
   * Checks a local user's password and signs short-lived user certificates for the given public key. A wrong
   * user name and a wrong password give the same error. Attempts are limited per user and source, atomically:
   * the attempt is reserved before the password check and released only when it succeeds (ratelimit.ts). A
   * locked user (or one holding a locked role) gets no certificate, whatever the password.
   */
  async login(request: { username: string; password: string; publicKeyPem: string; sshPublicKey: string; ttlMs?: number; source: string }): Promise<CertBundle> {
    const { username, source } = request;
    checkRequestKeys(request.publicKeyPem, request.sshPublicKey);
    const reservation = this.reserve(this.loginLimiter, loginKey(username, source), 'login', { user: username, source });
    let stored: StoredUser | undefined;
    let ok: boolean;
    try {
      stored = parseJson<StoredUser>(await this.backend.get(KEYS.user(username)));
      ok = await verifyPassword(request.password, stored?.passwordHash);
    } catch (err) {
      reservation.release();
      throw err;
    }
    if (!ok || !stored) {
      reservation.fail();
      await this.audit('user.login.failure', undefined, { user: username, source });
      throw new GatewayError('GW_ERR_AUTH_LOGIN_FAILED', 'invalid user name or password');
    }
    reservation.succeed();
    const roles = stored.resource.spec.roles;
    await this.locks.check({ user: username, roles });
    const ttlMs = Math.min(request.ttlMs ?? this.options.userCertTtlMs ?? DEFAULT_USER_CERT_TTL_MS, this.options.userCertTtlMs ?? DEFAULT_USER_CERT_TTL_MS);
    const logins = allowedLogins(await this.rolesOf(roles), stored.resource.spec.traits ?? {});
    const identity: Identity = { kind: 'user', name: username, cluster: this.clusterName, roles, logins };
    const bundle = await this.bundle(this.user, identity, request.publicKeyPem, request.sshPublicKey, ttlMs, 'client', [], logins.length > 0 ? logins : [`-gw-no-login-${username}`]);
    await this.audit('user.login', undefined, { user: username, source, roles });
    return bundle;
  }

  /** Reserves an attempt, or throws GW_ERR_AUTH_RATE_LIMITED (429) saying how long to wait. */
  private reserve(limiter: AttemptLimiter, key: string, what: 'login' | 'join', fields: Record<string, string>): Reservation {
    const reserved = limiter.reserve(key);
    if (reserved.ok) return reserved.reservation;
    const wait = Math.ceil(reserved.retryAfterMs / 1000);
    this.log.warn({ ...fields }, `${what} refused: too many failed attempts`);
    throw new GatewayError('GW_ERR_AUTH_RATE_LIMITED', `too many failed ${what}s${what === 'login' ? ' for this user' : ''} from this address; try again in ${wait} s`, {
      hint:
        what === 'login'
          ? `At most ${limiter.maxFailures} wrong passwords per user and address in ${limiter.windowMs / 60_000} minutes; wait, then use the right password.`
          : `At most ${limiter.maxFailures} failed joins per address in ${limiter.windowMs / 60_000} minutes; wait, then use a valid token from 'gwctl tokens add'.`,
      details: { retryAfterMs: reserved.retryAfterMs },
    });
  }

  private async bundle(
    ca: CertAuthority,
    identity: Identity,
    publicKeyPem: string,
    sshPublicKey: string,
    ttlMs: number,
    usage: 'client' | 'both',
    names: string[],
    sshPrincipals: string[],
  ): Promise<CertBundle> {
    const clock = this.options.clock ? { clock: this.options.clock } : {};
    const { dnsNames, ipAddresses } = splitNames(names);
    const tlsCert = await issueTlsCert(ca, { publicKeyPem, identity, dnsNames, ipAddresses, ttlMs, usage, ...clock });
    const sshCert = issueSshCert(ca, {
      publicKey: sshPublicKey,
      certType: ca.type,
      keyId: identity.name,
      principals: sshPrincipals,
      ttlMs,
      ...clock,
    });
    return {
      tlsCert,
      sshCert,
      hostCaPem: this.host.tls.certPem,
      userCaPem: this.user.tls.certPem,
      sshHostCa: this.host.ssh.publicKey,
      sshUserCa: this.user.ssh.publicKey,
      clusterName: this.clusterName,
      validUntil: new Date(this.clock() + ttlMs).toISOString(),
    };
  }

  // --- join tokens and joining ----------------------------------------------------------------------------------

  async addToken(caller: Identity, options: { roles: JoinRole[]; ttlMs?: number; uses?: number; token?: string }): Promise<{ token: string; id: string; expiresAt: string; roles: JoinRole[] }> {
    await this.authorize(caller, 'token', 'create');
    if (options.roles.length === 0) throw new GatewayError('GW_ERR_RESOURCE_INVALID', 'a token needs at least one type', { hint: `Types: ${JOIN_ROLES.join(', ')}.` });
    for (const role of options.roles) {
      if (!JOIN_ROLES.includes(role)) {
        throw new GatewayError('GW_ERR_RESOURCE_INVALID', `"${role}" is not a token type`, { hint: `Types: ${JOIN_ROLES.join(', ')}.` });
      }
    }
    const ttlMs = options.ttlMs ?? DEFAULT_TOKEN_TTL_MS;
    if (!(ttlMs > 0 && ttlMs <= MAX_TOKEN_TTL_MS)) {
      throw new GatewayError('GW_ERR_RESOURCE_INVALID', `token TTL must be more than 0 and at most ${MAX_TOKEN_TTL_MS / 3600_000} h`);
    }
    const token = options.token ?? randomBytes(16).toString('hex');
    const id = tokenId(token);
    const record: StoredToken = {
      id: id.slice(0, 12),
      roles: [...new Set(options.roles)],
      expiresAt: this.clock() + ttlMs,
      uses: options.uses ?? 1,
      used: 0,
      createdAt: new Date(this.clock()).toISOString(),
      createdBy: caller.name,
    };
    // Kept an hour past expiry so that a late join hears "expired" rather than "unknown".
    await this.backend.put(KEYS.token(id), JSON.stringify(record), { ttlMs: ttlMs + 3600_000 });
    await this.audit('token.create', caller, { token: record.id, roles: record.roles });
    return { token, id: record.id, expiresAt: new Date(record.expiresAt).toISOString(), roles: record.roles };
  }

  async listTokens(caller: Identity): Promise<Array<Omit<StoredToken, 'expiresAt'> & { expires: string }>> {
    await this.authorize(caller, 'token', 'list');
    return (await this.backend.range('/tokens/')).map((i) => {
      const { expiresAt, ...rest } = JSON.parse(i.value) as StoredToken;
      return { ...rest, expires: new Date(expiresAt).toISOString() };
    });
  }

  /** Removes a token given either its value or the short id that `tokens ls` shows. */
  async removeToken(caller: Identity, tokenOrId: string): Promise<void> {
    await this.authorize(caller, 'token', 'delete');
    if (await this.backend.delete(KEYS.token(tokenId(tokenOrId)))) return;
    for (const item of await this.backend.range('/tokens/')) {
      if ((JSON.parse(item.value) as StoredToken).id === tokenOrId) {
        await this.backend.delete(item.key);
        return;
      }
    }
    throw new GatewayError('GW_ERR_RESOURCE_NOT_FOUND', `no token "${tokenOrId.length > 12 ? tokenShortId(tokenOrId) : tokenOrId}"`);
  }

  /**
   * Exchanges a join token for host certificates. The token value never reaches a log line.
   *
   * Order, so that neither a bad request nor a guess costs anything it should not: (1) the whole request is
   * validated (400, nothing looked up); (2) an attempt is reserved for the source (429 when too many failed);
   * (3) the token is checked; (4) the certificates are made; (5) only then is a use of the token consumed.
   */
  async join(request: HostRequest): Promise<CertBundle & { hostId: string }> {
    const short = tokenId(request.token).slice(0, 12);
    if (request.roles.length === 0) throw this.refuseJoin(request, 'GW_ERR_AUTH_TOKEN_WRONG_TYPE', 'the join request names no service type');
    validateNodeName(request.nodename);
    checkRequestKeys(request.publicKeyPem, request.sshPublicKey);
    const reservation = this.reserve(this.joinLimiter, request.source, 'join', { token: short, source: request.source, nodename: request.nodename });
    try {
      const joined = await this.consumeToken(request);
      reservation.succeed();
      return joined;
    } catch (err) {
      if (err instanceof GatewayError && TOKEN_FAILURES.has(err.code)) reservation.fail();
      else reservation.release();
      throw err;
    }
  }

  private refuseJoin(request: HostRequest, code: 'GW_ERR_AUTH_TOKEN_UNKNOWN' | 'GW_ERR_AUTH_TOKEN_EXPIRED' | 'GW_ERR_AUTH_TOKEN_USED' | 'GW_ERR_AUTH_TOKEN_WRONG_TYPE', message: string): GatewayError {
    this.log.warn({ token: tokenId(request.token).slice(0, 12), source: request.source, nodename: request.nodename, code }, 'join refused');
    return new GatewayError(code, message);
  }

  /** Checks the token, makes the certificates, then consumes one use with compare-and-swap (racing joins: one wins). */
  private async consumeToken(request: HostRequest): Promise<CertBundle & { hostId: string }> {
    const id = tokenId(request.token);
    let made: { bundle: CertBundle; record: NodeRecord } | undefined;
    for (;;) {
      const item = await this.backend.get(KEYS.token(id));
      if (!item) throw this.refuseJoin(request, 'GW_ERR_AUTH_TOKEN_UNKNOWN', 'the join token is not known to this cluster');
      const record = JSON.parse(item.value) as StoredToken;
      if (record.expiresAt <= this.clock()) throw this.refuseJoin(request, 'GW_ERR_AUTH_TOKEN_EXPIRED', `the join token expired at ${new Date(record.expiresAt).toISOString()}`);
      if (record.uses > 0 && record.used >= record.uses) throw this.refuseJoin(request, 'GW_ERR_AUTH_TOKEN_USED', 'the join token has been used up');
      const wrong = request.roles.filter((r) => !record.roles.includes(r));
      if (wrong.length > 0) {
        throw this.refuseJoin(request, 'GW_ERR_AUTH_TOKEN_WRONG_TYPE', `the join token is for ${record.roles.join(', ')}, not for ${wrong.join(', ')}`);
      }
      made ??= await this.makeHost(request);
      const next = { ...record, used: record.used + 1 };
      try {
        await this.backend.compareAndSwap(KEYS.token(id), item.revision, JSON.stringify(next), { ttlMs: Math.max(1, record.expiresAt - this.clock()) + 3600_000 });
        break;
      } catch (err) {
        if (err instanceof GatewayError && err.code === 'GW_ERR_BACKEND_CONFLICT') continue;
        throw err;
      }
    }
    return this.recordHost(made, tokenId(request.token).slice(0, 12));
  }

  /** Host certificates for an agent running in this same process (no token: the process is trusted). */
  async joinLocal(request: { roles: JoinRole[]; nodename: string; publicAddrs: string[]; publicKeyPem: string; sshPublicKey: string }): Promise<CertBundle & { hostId: string }> {
    validateNodeName(request.nodename);
    return this.recordHost(await this.makeHost({ ...request, source: 'local', token: 'local' }), 'local');
  }

  /** The certificates of a new host; nothing is stored. A name the certificates cannot carry is the request's fault (400). */
  private async makeHost(request: HostRequest): Promise<{ bundle: CertBundle; record: NodeRecord }> {
    const hostId = randomUUID();
    const publicHosts = request.publicAddrs.map(hostOf);
    const principals = [...new Set([hostId, `${hostId}.${this.clusterName}`, request.nodename, ...publicHosts])];
    const identity: Identity = { kind: 'host', name: hostId, cluster: this.clusterName, roles: request.roles, nodename: request.nodename };
    let bundle: CertBundle;
    try {
      bundle = await this.bundle(this.host, identity, request.publicKeyPem, request.sshPublicKey, HOST_CERT_TTL_MS, 'both', principals, principals);
    } catch (err) {
      if (err instanceof GatewayError && err.code === 'GW_ERR_PKI_BAD_REQUEST') {
        throw new GatewayError('GW_ERR_API_BAD_REQUEST', `the join request cannot be certified: ${err.message}`, {
          hint: 'Check gateway.nodename and every public_addr of the agent: DNS names or IP addresses.',
          cause: err,
        });
      }
      throw err;
    }
    const record: NodeRecord = {
      hostId,
      nodename: request.nodename,
      roles: request.roles,
      publicAddrs: request.publicAddrs,
      joinedAt: new Date(this.clock()).toISOString(),
      source: request.source,
      sshPublicKey: request.sshPublicKey,
    };
    return { bundle, record };
  }

  private async recordHost(made: { bundle: CertBundle; record: NodeRecord }, token: string): Promise<CertBundle & { hostId: string }> {
    const { record } = made;
    await this.backend.put(KEYS.node(record.hostId), JSON.stringify(record));
    this.log.info({ hostId: record.hostId, nodename: record.nodename, roles: record.roles, token, source: record.source }, 'agent joined');
    await this.audit('host.join', undefined, { hostId: record.hostId, nodename: record.nodename, roles: record.roles, token });
    return { ...made.bundle, hostId: record.hostId };
  }

  // --- resources through gwctl ---------------------------------------------------------------------------------

  /**
   * Creates (or, with overwrite, upserts) every resource of a manifest atomically: either all are stored or none.
   * Returns one confirmation line per resource.
   */
  async createResources(caller: Identity, resources: Resource[], overwrite: boolean): Promise<string[]> {
    const conditions: Array<{ key: string; exists: false }> = [];
    const ops: Array<{ type: 'put'; key: string; value: string; ttlMs?: number }> = [];
    const messages: string[] = [];
    for (const resource of resources) {
      const { key, value, ttlMs, rbacKind } = await this.storageFor(resource, caller);
      const existing = await this.backend.get(key);
      await this.authorize(caller, rbacKind, existing ? 'update' : 'create');
      if (existing && !overwrite) {
        throw new GatewayError('GW_ERR_RESOURCE_EXISTS', `${resource.kind} "${displayName(resource)}" already exists`, {
          hint: 'Use gwctl create -f to overwrite it.',
        });
      }
      if (!existing) conditions.push({ key, exists: false });
      ops.push({ type: 'put', key, value, ...(ttlMs === undefined ? {} : { ttlMs }) });
      messages.push(
        resource.kind === 'cluster_maintenance_config'
          ? 'maintenance window has been updated'
          : `${resource.kind} "${displayName(resource)}" has been ${existing ? 'updated' : 'created'}`,
      );
    }
    try {
      await this.backend.atomicWrite(conditions, ops);
    } catch (err) {
      if (err instanceof GatewayError && err.code === 'GW_ERR_BACKEND_CONFLICT') {
        throw new GatewayError('GW_ERR_RESOURCE_EXISTS', `a resource in the manifest was created by someone else meanwhile (${String(err.details.key ?? '')})`, {
          hint: 'Run the command again; use -f to overwrite.',
        });
      }
      throw err;
    }
    for (const resource of resources) await this.audit(`${resource.kind}.write`, caller, { name: displayName(resource) });
    return messages;
  }

  private async storageFor(resource: Resource, caller: Identity): Promise<{ key: string; value: string; ttlMs?: number; rbacKind: string }> {
    switch (resource.kind) {
      case 'lock': {
        const lock = this.prepareLock(caller, resource as LockResource);
        return { key: lockKey(lock.metadata.name), value: JSON.stringify(lock), ...this.lockTtl(lock), rbacKind: 'lock' };
      }
      case 'role':
        return { key: KEYS.role(resource.metadata.name), value: JSON.stringify(resource), rbacKind: 'role' };
      case 'user': {
        const user = resource as UserResource;
        const existing = parseJson<StoredUser>(await this.backend.get(KEYS.user(user.metadata.name)));
        const stored: StoredUser = {
          resource: user,
          ...(existing?.passwordHash ? { passwordHash: existing.passwordHash } : {}),
          createdAt: existing?.createdAt ?? new Date(this.clock()).toISOString(),
        };
        await this.requireRolesExist(user.spec.roles);
        return { key: KEYS.user(user.metadata.name), value: JSON.stringify(stored), rbacKind: 'user' };
      }
      case 'token': {
        const token = resource as TokenResource;
        const expiresAt = token.metadata.expires ? Date.parse(token.metadata.expires) : this.clock() + DEFAULT_TOKEN_TTL_MS;
        if (!(expiresAt > this.clock())) {
          throw new GatewayError('GW_ERR_RESOURCE_INVALID', `token ${tokenShortId(token.metadata.name)}: metadata.expires is in the past`);
        }
        const id = tokenId(token.metadata.name);
        const record: StoredToken = {
          id: id.slice(0, 12),
          roles: token.spec.roles as JoinRole[],
          expiresAt,
          uses: token.spec.uses ?? 1,
          used: 0,
          createdAt: new Date(this.clock()).toISOString(),
          createdBy: 'manifest',
        };
        return { key: KEYS.token(id), value: JSON.stringify(record), ttlMs: expiresAt - this.clock() + 3600_000, rbacKind: 'token' };
      }
      case 'github':
      case 'saml':
      case 'oidc':
        return { key: KEYS.connector(resource.kind, resource.metadata.name), value: JSON.stringify(resource), rbacKind: resource.kind };
      case 'cluster_maintenance_config':
        return { key: KEYS.maintenance, value: JSON.stringify(resource), rbacKind: 'cluster_maintenance_config' };
      default:
        throw new GatewayError('GW_ERR_RESOURCE_INVALID', `resources of kind "${resource.kind}" cannot be created with gwctl`);
    }
  }

  /** Reads resources of a kind (all, or one by name). Secrets only with withSecrets. */
  async getResources(caller: Identity, kind: string, name: string | undefined, withSecrets: boolean): Promise<Resource[]> {
    const rbacKind = kind === 'nodes' ? 'node' : kind === 'events' ? 'event' : kind === 'locks' ? 'lock' : kind;
    // cluster_maintenance_config is a singleton: getting it is a read, as the seed's role (create/read/update/delete) expects.
    const singleton = kind === 'cluster_maintenance_config';
    await this.authorize(caller, rbacKind, name === undefined && !singleton ? 'list' : 'read');
    let found: Resource[];
    switch (kind) {
      case 'role': {
        const stored = (await this.backend.range('/roles/')).map((i) => JSON.parse(i.value) as RoleResource);
        const names = new Set(stored.map((r) => r.metadata.name));
        found = [...PRESET_ROLES.filter((r) => !names.has(r.metadata.name)), ...stored].sort((a, b) => a.metadata.name.localeCompare(b.metadata.name));
        break;
      }
      case 'user':
        found = (await this.backend.range('/users/')).map((i) => (JSON.parse(i.value) as StoredUser).resource);
        break;
      case 'lock':
      case 'locks':
        found = await this.locks.list();
        break;
      case 'token':
        found = (await this.backend.range('/tokens/')).map((i) => {
          const t = JSON.parse(i.value) as StoredToken;
          return { kind: 'token', version: 'v2', metadata: { name: t.id, expires: new Date(t.expiresAt).toISOString() }, spec: { roles: t.roles, uses: t.uses, used: t.used } } as unknown as Resource;
        });
        // Tokens are stored hashed: listing shows ids, never values, so there is nothing more to strip.
        return name === undefined ? found : found.filter((r) => r.metadata.name === name);
      case 'github':
      case 'saml':
      case 'oidc':
        found = (await this.backend.range(`/connectors/${kind}/`)).map((i) => JSON.parse(i.value) as Resource);
        break;
      case 'cluster_maintenance_config': {
        const item = parseJson<Resource>(await this.backend.get(KEYS.maintenance));
        found = item ? [item] : [];
        break;
      }
      case 'event':
      case 'events':
        found = (await this.backend.range('/events/')).map((i) => {
          const e = JSON.parse(i.value) as Record<string, unknown>;
          return { kind: 'event', version: 'v1', metadata: { name: i.key.slice('/events/'.length) }, spec: e } as unknown as Resource;
        });
        break;
      case 'node':
      case 'nodes':
        {
          const online = new Map((await this.listPresence()).map((p) => [p.hostId, p]));
          found = (await this.backend.range('/nodes/')).map((i) => {
            const n = JSON.parse(i.value) as NodeRecord;
            const p = online.get(n.hostId);
            return {
              kind: 'node',
              version: 'v2',
              metadata: { name: n.hostId, ...(p?.resources.node_labels ? { labels: p.resources.node_labels } : {}) },
              spec: {
                hostname: n.nodename,
                roles: n.roles,
                public_addrs: n.publicAddrs,
                joined_at: n.joinedAt,
                status: p ? 'online' : 'offline',
                ...(p ? { connected_since: p.connectedAt, last_heartbeat: p.lastHeartbeat, proxy: p.proxyId, services: p.services } : {}),
              },
            } as unknown as Resource;
          });
        }
        break;
      default:
        throw new GatewayError('GW_ERR_RESOURCE_KIND', `unknown resource kind "${kind}"`, {
          hint: 'Kinds: role, user, token, github, saml, oidc, cluster_maintenance_config, lock, node.',
        });
    }
    if (name !== undefined) {
      found = found.filter((r) => r.metadata.name === name);
      if (found.length === 0) throw new GatewayError('GW_ERR_RESOURCE_NOT_FOUND', `${kind} "${name}" does not exist`);
    }
    return withSecrets ? found : found.map((r) => withoutSecrets(r));
  }

  async removeResource(caller: Identity, kind: string, name: string): Promise<void> {
    await this.authorize(caller, kind === 'locks' ? 'lock' : kind, 'delete');
    let key: string;
    switch (kind) {
      case 'role':
        key = KEYS.role(name);
        break;
      case 'user':
        return this.removeUser(caller, name);
      case 'lock':
      case 'locks':
        await this.removeLocks(caller, { name });
        return;
      case 'token':
        return this.removeToken(caller, name);
      case 'github':
      case 'saml':
      case 'oidc':
        key = KEYS.connector(kind, name);
        break;
      case 'cluster_maintenance_config':
        key = KEYS.maintenance;
        break;
      default:
        throw new GatewayError('GW_ERR_RESOURCE_KIND', `resources of kind "${kind}" cannot be removed with gwctl`);
    }
    if (!(await this.backend.delete(key))) throw new GatewayError('GW_ERR_RESOURCE_NOT_FOUND', `${kind} "${name}" does not exist`);
    await this.audit(`${kind}.delete`, caller, { name });
  }

  // --- locks (locks.ts; docs/security.md) -------------------------------------------------------------------------

  /**
   * Creates a lock (gwctl lock) that lasts ttlMs, until expiresAt, or until removed. Everything the target has
   * open is closed through the Backend's watch.
   */
  async createLock(caller: Identity, options: { target: LockTarget; message?: string; ttlMs?: number; expiresAt?: number; name?: string }): Promise<LockResource> {
    await this.authorize(caller, 'lock', 'create');
    const expiresAt = options.ttlMs === undefined ? options.expiresAt : this.clock() + options.ttlMs;
    const lock = this.prepareLock(caller, {
      kind: 'lock',
      version: 'v2',
      metadata: { name: options.name ?? randomUUID() },
      spec: {
        target: options.target,
        ...(options.message ? { message: options.message } : {}),
        ...(expiresAt === undefined ? {} : { expires: new Date(expiresAt).toISOString() }),
      },
    });
    try {
      await this.backend.create(lockKey(lock.metadata.name), JSON.stringify(lock), this.lockTtl(lock));
    } catch (err) {
      if (err instanceof GatewayError && err.code === 'GW_ERR_BACKEND_EXISTS') {
        throw new GatewayError('GW_ERR_RESOURCE_EXISTS', `lock "${lock.metadata.name}" already exists`, { hint: 'Choose another --name, or leave it out for a generated one.' });
      }
      throw err;
    }
    this.log.info({ lock: lock.metadata.name, target: lock.spec.target, expires: lock.spec.expires, by: caller.name }, 'lock created');
    await this.audit('lock.create', caller, { name: lock.metadata.name, target: lock.spec.target, ...(lock.spec.expires ? { expires: lock.spec.expires } : {}) });
    return lock;
  }

  /** Removes one lock by name, or every lock on a target (gwctl unlock). Returns the names removed. */
  async removeLocks(caller: Identity, which: { name: string } | { target: LockTarget }): Promise<string[]> {
    await this.authorize(caller, 'lock', 'delete');
    let names: string[];
    if ('name' in which) {
      names = [which.name];
    } else {
      const { kind, value } = targetOf(which.target);
      names = (await this.locks.list()).filter((l) => l.spec.target[kind] === value).map((l) => l.metadata.name);
    }
    const removed: string[] = [];
    for (const name of names) if (await this.backend.delete(lockKey(name))) removed.push(name);
    if (removed.length === 0) {
      throw new GatewayError('GW_ERR_RESOURCE_NOT_FOUND', 'name' in which ? `lock "${which.name}" does not exist` : `no lock on ${describeTarget(which.target)}`, {
        hint: "List locks with 'gwctl get locks'; an expired lock is gone by itself.",
      });
    }
    this.log.info({ locks: removed, by: caller.name }, 'locks removed');
    await this.audit('lock.delete', caller, { names: removed });
    return removed;
  }

  /** A lock as it is stored: one valid target, a name, an expiry in the future; created_at/by set here. */
  private prepareLock(caller: Identity, lock: LockResource): LockResource {
    const { kind, value } = targetOf(lock.spec.target);
    if (!LOCK_NAME.test(lock.metadata.name)) {
      throw new GatewayError('GW_ERR_RESOURCE_INVALID', `"${lock.metadata.name}" is not a valid lock name`, { hint: 'Lock names are 1-128 letters, digits, ".", "_" or "-".' });
    }
    if (lock.spec.expires !== undefined && !(Date.parse(lock.spec.expires) > this.clock())) {
      throw new GatewayError('GW_ERR_RESOURCE_INVALID', `lock "${lock.metadata.name}": its expiry ${lock.spec.expires} is not in the future`);
    }
    const message = lock.spec.message?.slice(0, 1024);
    return {
      kind: 'lock',
      version: 'v2',
      metadata: { ...lock.metadata },
      spec: {
        target: { [kind]: value },
        ...(message ? { message } : {}),
        ...(lock.spec.expires === undefined ? {} : { expires: new Date(Date.parse(lock.spec.expires)).toISOString() }),
        created_at: new Date(this.clock()).toISOString(),
        created_by: caller.kind === 'admin' ? 'admin' : caller.name,
      },
    };
  }

  /** The Backend TTL of a lock: its expiry, so that an expired lock is invisible to every reader at once. */
  private lockTtl(lock: LockResource): { ttlMs?: number } {
    return lock.spec.expires === undefined ? {} : { ttlMs: Math.max(1, Date.parse(lock.spec.expires) - this.clock()) };
  }

  async getNode(hostId: string): Promise<NodeRecord | undefined> {
    return parseJson<NodeRecord>(await this.backend.get(KEYS.node(hostId)));
  }

  async setPresence(presence: Presence, ttlMs: number): Promise<void> {
    await this.backend.put(KEYS.presence(presence.hostId), JSON.stringify(presence), { ttlMs });
  }

  /** Removes the presence record, unless another proxy wrote it meanwhile (the agent reconnected elsewhere). */
  async clearPresence(hostId: string, proxyId: string): Promise<void> {
    const item = await this.backend.get(KEYS.presence(hostId));
    if (!item || (JSON.parse(item.value) as Presence).proxyId !== proxyId) return;
    try {
      await this.backend.atomicWrite([{ key: item.key, revision: item.revision }], [{ type: 'delete', key: item.key }]);
    } catch (err) {
      if (!(err instanceof GatewayError && err.code === 'GW_ERR_BACKEND_CONFLICT')) throw err;
    }
  }

  async listPresence(): Promise<Presence[]> {
    return (await this.backend.range('/presence/')).map((i) => JSON.parse(i.value) as Presence);
  }

  /**
   * What the caller may reach right now, from the agents' presence: nodes, databases, apps, desktops or kube
   * clusters, each with its labels, agent and since when it is connected. Filtered by the caller's roles.
   */
  async inventory(caller: Identity, kind: string): Promise<InventoryItem[]> {
    const kinds: Record<string, AccessKind> = { node: 'node', nodes: 'node', db: 'db', app: 'app', apps: 'app', desktop: 'windows_desktop', desktops: 'windows_desktop', kube: 'kube_cluster' };
    const accessKind = kinds[kind];
    if (!accessKind) throw new GatewayError('GW_ERR_RESOURCE_KIND', `unknown inventory kind "${kind}"`, { hint: 'Kinds: node, db, app, desktop, kube.' });
    if (caller.kind !== 'admin' && caller.kind !== 'user') throw new GatewayError('GW_ERR_ACCESS_DENIED', 'host identities have no inventory');
    if (caller.cluster !== this.clusterName && caller.kind !== 'admin') throw new GatewayError('GW_ERR_ACCESS_DENIED', `identity from cluster "${caller.cluster}"`);
    const roles = caller.kind === 'admin' ? undefined : await this.rolesOf((await this.resolveCaller(caller)).roles);
    const allowed = (labels: Record<string, string>) => roles === undefined || canAccess(roles, accessKind, labels);
    const items: InventoryItem[] = [];
    for (const p of await this.listPresence()) {
      const base = { agent: p.nodename, host_id: p.hostId, connected_since: p.connectedAt };
      if (accessKind === 'node' && p.services.includes('ssh')) {
        const labels = p.resources.node_labels ?? {};
        if (allowed(labels)) items.push({ ...base, name: p.nodename, labels, ...(p.resources.node_host_cert ? { host_cert: p.resources.node_host_cert } : {}) });
      } else if (accessKind === 'db') {
        for (const d of p.resources.databases) if (allowed(d.labels)) items.push({ ...base, name: d.name, protocol: d.protocol, labels: d.labels });
      } else if (accessKind === 'app') {
        for (const a of p.resources.apps) if (allowed(a.labels)) items.push({ ...base, name: a.name, protocol: a.kind, labels: a.labels, ...(a.public_addr ? { public_addr: a.public_addr } : {}) });
      } else if (accessKind === 'windows_desktop') {
        for (const d of p.resources.desktops) if (allowed(d.labels)) items.push({ ...base, name: d.name, labels: d.labels });
      } else if (accessKind === 'kube_cluster') {
        for (const k of p.resources.kube_clusters) if (allowed(k.labels)) items.push({ ...base, name: k.name, labels: k.labels });
      }
    }
    return items.sort((a, b) => a.name.localeCompare(b.name));
  }

  status(caller: Identity): { cluster_name: string; version: string; ca_pin: string; identity: { kind: string; name: string; roles: string[] }; proxy_public_addr?: string } {
    return {
      cluster_name: this.clusterName,
      version: VERSION,
      ca_pin: this.caPin(),
      identity: { kind: caller.kind, name: caller.name, roles: caller.roles },
      ...(this.options.proxyPublicAddr ? { proxy_public_addr: this.options.proxyPublicAddr } : {}),
    };
  }

  /**
   * The cluster_maintenance_config for agents (their upgraders need the windows): readable by any host
   * identity of this cluster, and by callers with read on the resource.
   */
  async maintenanceForAgent(caller: Identity): Promise<Resource | undefined> {
    if (caller.kind === 'host') {
      if (caller.cluster !== this.clusterName) throw new GatewayError('GW_ERR_ACCESS_DENIED', `identity from cluster "${caller.cluster}"`);
      await this.resolveCaller(caller);
    } else {
      await this.authorize(caller, 'cluster_maintenance_config', 'read');
    }
    return parseJson<Resource>(await this.backend.get(KEYS.maintenance));
  }

  /** Calls onChange after every write or removal of cluster_maintenance_config. Returns the unsubscribe function. */
  watchMaintenance(onChange: () => void): () => void {
    return this.backend.watch(KEYS.maintenance, () => onChange());
  }

  /** An audit event reported by an agent (SSH sessions); who reported it is recorded with it. */
  async recordAgentEvent(hostId: string, nodename: string, event: Record<string, unknown>): Promise<void> {
    const time = this.clock();
    const text = JSON.stringify({ ...event, reported_by: { host_id: hostId, nodename } });
    if (text.length > 64 * 1024) return;
    await this.backend.put(KEYS.event(time), text, { ttlMs: 30 * 24 * 3600_000 });
  }

  private async audit(event: string, caller: Identity | undefined, fields: Record<string, unknown>): Promise<void> {
    const time = this.clock();
    const record = { event, time: new Date(time).toISOString(), ...(caller ? { by: { kind: caller.kind, name: caller.name } } : {}), ...fields };
    // Audit events live 30 days in the backend.
    await this.backend.put(KEYS.event(time), JSON.stringify(record), { ttlMs: 30 * 24 * 3600_000 });
  }
}

function displayName(resource: Resource): string {
  return resource.kind === 'token' ? tokenShortId(resource.metadata.name) : resource.metadata.name;
}

function hostOf(addr: string): string {
  const m = /^\[([^\]]+)\](?::\d+)?$/.exec(addr);
  if (m) return m[1]!;
  const colons = addr.split(':').length - 1;
  return colons === 1 ? addr.slice(0, addr.lastIndexOf(':')) : addr;
}

function splitNames(names: string[]): { dnsNames: string[]; ipAddresses: string[] } {
  const hosts = [...new Set(names.map(hostOf))];
  return { dnsNames: hosts.filter((h) => isIP(h) === 0), ipAddresses: hosts.filter((h) => isIP(h) !== 0) };
}

const NAME = /^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$/;
const LOCK_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

function validateUserName(name: string): void {
  if (!NAME.test(name)) {
    throw new GatewayError('GW_ERR_RESOURCE_INVALID', `"${name}" is not a valid user name`, {
      hint: 'User names are 1-128 letters, digits, ".", "_", "@" or "-", starting with a letter or digit.',
    });
  }
}

/**
 * The keys of a login or join request, checked before anything else happens (no password check, no token
 * lookup): GW_ERR_API_BAD_KEY names the field. Never echoes key text.
 */
function checkRequestKeys(publicKeyPem: string, sshPublicKey: string): void {
  try {
    loadPublicKey(publicKeyPem, 'public_key');
  } catch {
    throw new GatewayError('GW_ERR_API_BAD_KEY', '"public_key" is not a PEM public key (-----BEGIN PUBLIC KEY-----)');
  }
  try {
    keyFromBlob(blobFromLine(sshPublicKey.includes('-----BEGIN') ? sshPublicKeyFromPem(sshPublicKey) : sshPublicKey).blob);
  } catch {
    throw new GatewayError('GW_ERR_API_BAD_KEY', '"ssh_public_key" is not an OpenSSH public key line of a supported type ("ecdsa-sha2-nistp256 AAAA...")');
  }
}

function validateNodeName(name: string): void {
  if (!NAME.test(name)) {
    throw new GatewayError('GW_ERR_RESOURCE_INVALID', `"${name}" is not a valid node name`, {
      hint: 'Set gateway.nodename to 1-128 letters, digits, ".", "_" or "-".',
    });
  }
}
