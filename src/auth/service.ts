/**
 * The Auth Service: owns the cluster's identity (name, certificate authorities), its users, roles, join tokens,
 * connectors and cluster_maintenance_config, and signs every certificate. All state is in the Backend; every
 * call made on behalf of someone is checked against that caller's roles (deny wins) before it touches state.
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
import { LoginRateLimiter } from './ratelimit.js';
import { allowedLogins, canAccess, checkAccess, PRESET_ROLES, type AccessKind, type Verb } from './rbac.js';
import { tokenId as resourceTokenId, withoutSecrets, type Resource, type RoleResource, type TokenResource, type UserResource } from './resources/index.js';

export const JOIN_ROLES = ['node', 'db', 'app', 'kube', 'desktop', 'proxy'] as const;
export type JoinRole = (typeof JOIN_ROLES)[number];

export const DEFAULT_USER_CERT_TTL_MS = 12 * 3600_000;
export const HOST_CERT_TTL_MS = 365 * 24 * 3600_000;
export const DEFAULT_TOKEN_TTL_MS = 30 * 60_000;
const MAX_TOKEN_TTL_MS = 7 * 24 * 3600_000;

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
  private readonly limiter: LoginRateLimiter;
  private readonly clock: () => number;

  private constructor(
    private readonly backend: Backend,
    readonly clusterName: string,
    readonly host: CertAuthority,
    readonly user: CertAuthority,
    private readonly options: AuthServiceOptions,
  ) {
    this.clock = options.clock ?? Date.now;
    this.limiter = new LoginRateLimiter({ clock: this.clock });
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

  /** Throws GW_ERR_ACCESS_DENIED unless caller may do verb on resource. */
  async authorize(caller: Identity, resource: string, verb: Verb): Promise<void> {
    if (caller.kind === 'admin') return;
    if (caller.cluster !== this.clusterName) {
      throw new GatewayError('GW_ERR_ACCESS_DENIED', `identity from cluster "${caller.cluster}" is not valid in "${this.clusterName}"`);
    }
    if (caller.kind !== 'user') {
      throw new GatewayError('GW_ERR_ACCESS_DENIED', `host identities cannot ${verb} ${resource}`);
    }
    const decision = checkAccess(await this.rolesOf(caller.roles), resource, verb);
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

  /** A local user's current roles, or undefined when there is no such user (for the SSH jump host). */
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
   * user name and a wrong password give the same error; failures are rate limited per user and source.
   */
  async login(request: { username: string; password: string; publicKeyPem: string; sshPublicKey: string; ttlMs?: number; source: string }): Promise<CertBundle> {
    const { username, source } = request;
    const wait = this.limiter.retryAfterMs(username, source);
    if (wait > 0) {
      this.log.warn({ user: username, source }, 'login refused: too many failed attempts');
      throw new GatewayError('GW_ERR_AUTH_RATE_LIMITED', `too many failed login attempts; try again in ${Math.ceil(wait / 1000)} s`, {
        details: { retryAfterMs: wait },
      });
    }
    const stored = parseJson<StoredUser>(await this.backend.get(KEYS.user(username)));
    const ok = await verifyPassword(request.password, stored?.passwordHash);
    if (!ok || !stored) {
      this.limiter.recordFailure(username, source);
      await this.audit('user.login.failure', undefined, { user: username, source });
      throw new GatewayError('GW_ERR_AUTH_LOGIN_FAILED', 'invalid user name or password');
    }
    this.limiter.recordSuccess(username, source);
    const ttlMs = Math.min(request.ttlMs ?? this.options.userCertTtlMs ?? DEFAULT_USER_CERT_TTL_MS, this.options.userCertTtlMs ?? DEFAULT_USER_CERT_TTL_MS);
    const roles = stored.resource.spec.roles;
    const logins = allowedLogins(await this.rolesOf(roles), stored.resource.spec.traits ?? {});
    const identity: Identity = { kind: 'user', name: username, cluster: this.clusterName, roles, logins };
    const bundle = await this.bundle(this.user, identity, request.publicKeyPem, request.sshPublicKey, ttlMs, 'client', [], logins.length > 0 ? logins : [`-gw-no-login-${username}`]);
    await this.audit('user.login', undefined, { user: username, source, roles });
    return bundle;
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

  /** Exchanges a join token for host certificates. The token value never reaches a log line. */
  async join(request: HostRequest): Promise<CertBundle & { hostId: string }> {
    const id = tokenId(request.token);
    const short = id.slice(0, 12);
    const refuse = (code: 'GW_ERR_AUTH_TOKEN_UNKNOWN' | 'GW_ERR_AUTH_TOKEN_EXPIRED' | 'GW_ERR_AUTH_TOKEN_USED' | 'GW_ERR_AUTH_TOKEN_WRONG_TYPE', message: string) => {
      this.log.warn({ token: short, source: request.source, nodename: request.nodename, code }, 'join refused');
      return new GatewayError(code, message);
    };
    if (request.roles.length === 0) throw refuse('GW_ERR_AUTH_TOKEN_WRONG_TYPE', 'the join request names no service type');
    validateNodeName(request.nodename);
    // Check-and-consume with compare-and-swap: two agents racing for the last use cannot both win.
    for (;;) {
      const item = await this.backend.get(KEYS.token(id));
      if (!item) throw refuse('GW_ERR_AUTH_TOKEN_UNKNOWN', 'the join token is not known to this cluster');
      const record = JSON.parse(item.value) as StoredToken;
      if (record.expiresAt <= this.clock()) throw refuse('GW_ERR_AUTH_TOKEN_EXPIRED', `the join token expired at ${new Date(record.expiresAt).toISOString()}`);
      if (record.uses > 0 && record.used >= record.uses) throw refuse('GW_ERR_AUTH_TOKEN_USED', 'the join token has been used up');
      const wrong = request.roles.filter((r) => !record.roles.includes(r));
      if (wrong.length > 0) {
        throw refuse('GW_ERR_AUTH_TOKEN_WRONG_TYPE', `the join token is for ${record.roles.join(', ')}, not for ${wrong.join(', ')}`);
      }
      const next = { ...record, used: record.used + 1 };
      try {
        await this.backend.compareAndSwap(KEYS.token(id), item.revision, JSON.stringify(next), { ttlMs: Math.max(1, record.expiresAt - this.clock()) + 3600_000 });
        break;
      } catch (err) {
        if (err instanceof GatewayError && err.code === 'GW_ERR_BACKEND_CONFLICT') continue;
        throw err;
      }
    }
    return this.issueHost({ ...request, token: short });
  }

  /** Host certificates for an agent running in this same process (no token: the process is trusted). */
  async joinLocal(request: { roles: JoinRole[]; nodename: string; publicAddrs: string[]; publicKeyPem: string; sshPublicKey: string }): Promise<CertBundle & { hostId: string }> {
    validateNodeName(request.nodename);
    return this.issueHost({ ...request, source: 'local', token: 'local' });
  }

  private async issueHost(request: HostRequest): Promise<CertBundle & { hostId: string }> {
    const hostId = randomUUID();
    const publicHosts = request.publicAddrs.map(hostOf);
    const principals = [...new Set([hostId, `${hostId}.${this.clusterName}`, request.nodename, ...publicHosts])];
    const identity: Identity = { kind: 'host', name: hostId, cluster: this.clusterName, roles: request.roles, nodename: request.nodename };
    const bundle = await this.bundle(this.host, identity, request.publicKeyPem, request.sshPublicKey, HOST_CERT_TTL_MS, 'both', principals, principals);
    const record: NodeRecord = {
      hostId,
      nodename: request.nodename,
      roles: request.roles,
      publicAddrs: request.publicAddrs,
      joinedAt: new Date(this.clock()).toISOString(),
      source: request.source,
      sshPublicKey: request.sshPublicKey,
    };
    await this.backend.put(KEYS.node(hostId), JSON.stringify(record));
    this.log.info({ hostId, nodename: request.nodename, roles: request.roles, token: request.token, source: request.source }, 'agent joined');
    await this.audit('host.join', undefined, { hostId, nodename: request.nodename, roles: request.roles, token: request.token });
    return { ...bundle, hostId };
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
      const { key, value, ttlMs, rbacKind } = await this.storageFor(resource);
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

  private async storageFor(resource: Resource): Promise<{ key: string; value: string; ttlMs?: number; rbacKind: string }> {
    switch (resource.kind) {
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
    const rbacKind = kind === 'nodes' ? 'node' : kind === 'events' ? 'event' : kind;
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
          hint: 'Kinds: role, user, token, github, saml, oidc, cluster_maintenance_config, node.',
        });
    }
    if (name !== undefined) {
      found = found.filter((r) => r.metadata.name === name);
      if (found.length === 0) throw new GatewayError('GW_ERR_RESOURCE_NOT_FOUND', `${kind} "${name}" does not exist`);
    }
    return withSecrets ? found : found.map((r) => withoutSecrets(r));
  }

  async removeResource(caller: Identity, kind: string, name: string): Promise<void> {
    await this.authorize(caller, kind, 'delete');
    let key: string;
    switch (kind) {
      case 'role':
        key = KEYS.role(name);
        break;
      case 'user':
        return this.removeUser(caller, name);
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
    const roles = caller.kind === 'admin' ? undefined : await this.rolesOf(caller.roles);
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

function validateUserName(name: string): void {
  if (!NAME.test(name)) {
    throw new GatewayError('GW_ERR_RESOURCE_INVALID', `"${name}" is not a valid user name`, {
      hint: 'User names are 1-128 letters, digits, ".", "_", "@" or "-", starting with a letter or digit.',
    });
  }
}

function validateNodeName(name: string): void {
  if (!NAME.test(name)) {
    throw new GatewayError('GW_ERR_RESOURCE_INVALID', `"${name}" is not a valid node name`, {
      hint: 'Set gateway.nodename to 1-128 letters, digits, ".", "_" or "-".',
    });
  }
}
