/**
 * The Auth Service: owns the cluster's identity (name, certificate authorities), its users, roles, join tokens,
 * connectors, locks and cluster_maintenance_config, and signs every certificate. All state is in the Backend.
 *
 * This class is the facade that composes the modules, one per concern, and forwards to them:
 *
 *   authorities.ts  cluster name, CAs, certificates          callers.ts    the caller as it stands now, rules
 *   users.ts        users, passwords, login                   joining.ts    join tokens, joining, node records
 *   lockadmin.ts    creating and removing locks (locks.ts reads them)
 *   agents.ts       presence, inventory, maintenance config   audit.ts      the audit log
 *   websessions.ts  the browser's sessions, the web terminal's SSH certificates, app launches and app sessions
 *   manifests.ts    resources through gwctl (create -f, get, rm), stored by the module that owns each kind
 *   apply.ts        gwctl apply: the plan against what is stored, and its one conditioned write
 *   rollout/        the managed rollout: its pure planner, its controller, the agents' instructions
 *
 * Transport-agnostic: api.ts exposes these methods over HTTPS (mutual TLS on 3025, and the public subset on the
 * Proxy's web port); proxyauth.ts names what the Proxy uses of it.
 */
import type { Backend } from '../backend/index.js';
import type { Dialer } from '../dial/dialer.js';
import { logger } from '../log.js';
import { VERSION } from '../version.js';
import { AgentDirectory } from './agents.js';
import { AuditLog } from './audit.js';
import { Authorities } from './authorities.js';
import { CallerCheck } from './callers.js';
import { Joining } from './joining.js';
import { LockAdmin } from './lockadmin.js';
import { LockStore } from './locks.js';
import { Manifests } from './manifests.js';
import { Applier } from './apply.js';
import { RolloutController } from './rollout/controller.js';
import type { CertAuthority, Identity } from './pki.js';
import type { ProxyAuth } from './proxyauth.js';
import type { NodeRecord } from './records.js';
import type { MemberName } from './reserved.js';
import { SessionRegistry } from './sessions.js';
import { SsoService, type AuthPreference } from './sso/index.js';
import { DEFAULT_USER_CERT_TTL_MS, Users } from './users.js';
import { WebSessions, type CreatedWebSession, type CreateWebSessionOptions, type WebSessionView } from './websessions.js';

export { HOST_CERT_TTL_MS, type CertBundle, type PublicCas } from './authorities.js';
export { type InventoryItem } from './agents.js';
export { DEFAULT_TOKEN_TTL_MS, JOIN_LIMIT, tokenShortId, type HostRequest } from './joining.js';
export { JOIN_ROLES, type JoinRole, type NodeRecord, type Presence, type ProxyRecord, type TunnelStrategy } from './records.js';
export { DEFAULT_USER_CERT_TTL_MS, LOGIN_LIMIT } from './users.js';
export { type CreatedWebSession, type CreateWebSessionOptions, type WebSessionView } from './websessions.js';

export interface AuthServiceOptions {
  backend: Backend;
  clusterName: string;
  clock?: () => number;
  userCertTtlMs?: number;
  /** What `gwctl tokens add` prints as --proxy: the first proxy public address, if the proxy runs here. */
  proxyPublicAddr?: string;
  /** Outbound requests to identity providers (single sign-on) go through it. */
  dialer?: Dialer;
  /** Names of this process's members from its configuration, reserved from agents' joins (src/auth/reserved.ts). */
  memberNames?: readonly MemberName[];
  /** auth_service.authentication: what /webapi/ping and the login page offer first. */
  authentication?: { type: 'local' | 'oidc' | 'saml' | 'github'; connector_name: string };
  /** The control plane's version for the rollout's safety rules: this build's (src/version.ts) unless a test says otherwise. */
  controlPlaneVersion?: string;
}

interface Parts {
  authorities: Authorities;
  callers: CallerCheck;
  users: Users;
  joining: Joining;
  lockAdmin: LockAdmin;
  agents: AgentDirectory;
  audit: AuditLog;
  manifests: Manifests;
  applier: Applier;
  sso: SsoService;
  webSessions: WebSessions;
  rollout: RolloutController;
}

export class AuthService implements ProxyAuth {
  /** What is open on behalf of identities in this process; closed on lock or deletion (docs/security.md). */
  readonly sessions = new SessionRegistry();
  readonly clusterName: string;
  readonly host: CertAuthority;
  readonly user: CertAuthority;

  private constructor(
    private readonly parts: Parts,
    private readonly proxyPublicAddr: string | undefined,
  ) {
    this.clusterName = parts.authorities.clusterName;
    this.host = parts.authorities.host;
    this.user = parts.authorities.user;
  }

  /** Opens the cluster's state, creating the name and the authorities on first start. */
  static async open(options: AuthServiceOptions): Promise<AuthService> {
    const { backend } = options;
    const log = logger('auth');
    const clock = options.clock ?? Date.now;
    const authorities = await Authorities.open(backend, options.clusterName, options.clock);
    const locks = new LockStore(backend, clock);
    const audit = new AuditLog(backend, clock);
    const callers = new CallerCheck(backend, options.clusterName, locks, log);
    const users = new Users({ backend, clock, callers, authorities, audit, locks, log, ...(options.userCertTtlMs === undefined ? {} : { userCertTtlMs: options.userCertTtlMs }) });
    const joining = new Joining({ backend, clock, callers, authorities, audit, log, ...(options.memberNames ? { memberNames: options.memberNames } : {}) });
    const lockAdmin = new LockAdmin({ backend, clock, callers, audit, store: locks, log });
    const agents = new AgentDirectory(backend, options.clusterName, callers);
    const rollout = new RolloutController({ backend, agents, audit, callers, clock, controlPlane: options.controlPlaneVersion ?? VERSION, log: logger('autoupdate') });
    const manifests = new Manifests({ backend, callers, audit, users, joining, lockAdmin, locks, agents, rollout: { status: () => rollout.status() } });
    const applier = new Applier({ backend, callers, audit, manifests });
    const webSessions = new WebSessions({ backend, clock, callers, authorities, audit, log, userCertTtlMs: options.userCertTtlMs ?? DEFAULT_USER_CERT_TTL_MS });
    const sso = new SsoService({
      backend, clock, callers, authorities, audit, locks, log,
      userCertTtlMs: options.userCertTtlMs ?? DEFAULT_USER_CERT_TTL_MS,
      authentication: options.authentication ?? { type: 'local', connector_name: '' },
      webSessions,
      ...(options.dialer ? { dialer: options.dialer } : {}),
    });
    const service = new AuthService({ authorities, callers, users, joining, lockAdmin, agents, audit, manifests, applier, sso, webSessions, rollout }, options.proxyPublicAddr);
    callers.watchRevocations(service.sessions);
    // A lock on a Proxy, or its removal, also takes its record out of the cluster's list (agents.ts).
    callers.watchRevocationScopes((why, scope) => {
      if (scope.kind !== 'host') return;
      agents.forgetRevokedProxy(scope.name).then(
        (removed) => removed && log.info({ proxy: scope.name, why }, 'Proxy record removed: its identity is revoked'),
        (err: unknown) => log.warn({ proxy: scope.name, err: (err as Error).message }, 'cannot remove the record of a revoked Proxy'),
      );
    });
    log.info({ cluster: options.clusterName, ca_pin: service.caPin() }, 'auth service ready');
    return service;
  }

  status(caller: Identity): { cluster_name: string; version: string; ca_pin: string; identity: { kind: string; name: string; roles: string[] }; proxy_public_addr?: string } {
    return {
      cluster_name: this.clusterName,
      version: VERSION,
      ca_pin: this.caPin(),
      identity: { kind: caller.kind, name: caller.name, roles: caller.roles },
      ...(this.proxyPublicAddr ? { proxy_public_addr: this.proxyPublicAddr } : {}),
    };
  }

  // --- cluster identity and certificates (authorities.ts) ---------------------------------------------------------
  caPin(...a: Parameters<Authorities['caPin']>) { return this.parts.authorities.caPin(...a); }
  publicCas(...a: Parameters<Authorities['publicCas']>) { return this.parts.authorities.publicCas(...a); }
  adminIdentity(...a: Parameters<Authorities['adminIdentity']>) { return this.parts.authorities.adminIdentity(...a); }
  issueServerCert(...a: Parameters<Authorities['issueServerCert']>) { return this.parts.authorities.issueServerCert(...a); }
  issueAdminCert(...a: Parameters<Authorities['issueAdminCert']>) { return this.parts.authorities.issueAdminCert(...a); }

  /** Single sign-on through the connectors (sso/index.ts; routes in ssoapi.ts). */
  get sso(): SsoService { return this.parts.sso; }
  /** auth_service.authentication as /webapi/ping reports it (ProxyAuth). */
  authPreference(): Promise<AuthPreference> { return this.parts.sso.authPreference(); }

  // --- the caller as it stands now, and rules (callers.ts) -------------------------------------------------------
  rolesOf(...a: Parameters<CallerCheck['rolesOf']>) { return this.parts.callers.rolesOf(...a); }
  resolveCaller(...a: Parameters<CallerCheck['resolveCaller']>) { return this.parts.callers.resolveCaller(...a); }
  resolveSshUser(...a: Parameters<CallerCheck['resolveSshUser']>) { return this.parts.callers.resolveSshUser(...a); }
  revocationOf(...a: Parameters<CallerCheck['revocationOf']>) { return this.parts.callers.revocationOf(...a); }
  watchRevocationScopes(...a: Parameters<CallerCheck['watchRevocationScopes']>) { return this.parts.callers.watchRevocationScopes(...a); }
  authorize(...a: Parameters<CallerCheck['authorize']>) { return this.parts.callers.authorize(...a); }
  authorizeAny(...a: Parameters<CallerCheck['authorizeAny']>) { return this.parts.callers.authorizeAny(...a); }
  userRoles(...a: Parameters<CallerCheck['userRoles']>) { return this.parts.callers.userRoles(...a); }
  getNode(...a: Parameters<CallerCheck['getNode']>) { return this.parts.callers.getNode(...a); }
  /** For the Proxy (ProxyAuth): the node records, as `gwctl get nodes` reads them. */
  async listNodes(): Promise<NodeRecord[]> {
    return (await this.parts.agents.nodeResources()).map((r) => {
      const spec = r.spec as { hostname: string; roles: NodeRecord['roles']; public_addrs: string[]; joined_at: string };
      return { hostId: r.metadata.name, nodename: spec.hostname, roles: spec.roles, publicAddrs: spec.public_addrs, joinedAt: spec.joined_at };
    });
  }

  // --- users and login (users.ts) ----------------------------------------------------------------------------------
  addUser(...a: Parameters<Users['addUser']>) { return this.parts.users.addUser(...a); }
  setUserRoles(...a: Parameters<Users['setUserRoles']>) { return this.parts.users.setUserRoles(...a); }
  listUsers(...a: Parameters<Users['listUsers']>) { return this.parts.users.listUsers(...a); }
  removeUser(...a: Parameters<Users['removeUser']>) { return this.parts.users.removeUser(...a); }
  login(...a: Parameters<Users['login']>) { return this.parts.users.login(...a); }

  // --- join tokens and joining (joining.ts) ------------------------------------------------------------------------
  addToken(...a: Parameters<Joining['addToken']>) { return this.parts.joining.addToken(...a); }
  listTokens(...a: Parameters<Joining['listTokens']>) { return this.parts.joining.listTokens(...a); }
  removeToken(...a: Parameters<Joining['removeToken']>) { return this.parts.joining.removeToken(...a); }
  join(...a: Parameters<Joining['join']>) { return this.parts.joining.join(...a); }
  joinLocal(...a: Parameters<Joining['joinLocal']>) { return this.parts.joining.joinLocal(...a); }
  renewHost(...a: Parameters<Joining['renewHost']>) { return this.parts.joining.renewHost(...a); }
  markPresenceSigned(...a: Parameters<Joining['markPresenceSigned']>) { return this.parts.joining.markPresenceSigned(...a); }

  // --- resources through gwctl (manifests.ts) and locks (lockadmin.ts) --------------------------------------------
  createResources(...a: Parameters<Manifests['createResources']>) { return this.parts.manifests.createResources(...a); }
  getResources(...a: Parameters<Manifests['getResources']>) { return this.parts.manifests.getResources(...a); }
  removeResource(...a: Parameters<Manifests['removeResource']>) { return this.parts.manifests.removeResource(...a); }
  applyResources(...a: Parameters<Applier['apply']>) { return this.parts.applier.apply(...a); }
  createLock(...a: Parameters<LockAdmin['createLock']>) { return this.parts.lockAdmin.createLock(...a); }
  removeLocks(...a: Parameters<LockAdmin['removeLocks']>) { return this.parts.lockAdmin.removeLocks(...a); }

  // --- agents: presence, inventory, maintenance (agents.ts); their events (audit.ts) -----------------------------
  setPresence(...a: Parameters<AgentDirectory['setPresence']>) { return this.parts.agents.setPresence(...a); }
  clearPresence(...a: Parameters<AgentDirectory['clearPresence']>) { return this.parts.agents.clearPresence(...a); }
  listPresence(...a: Parameters<AgentDirectory['listPresence']>) { return this.parts.agents.listPresence(...a); }
  presenceOf(...a: Parameters<AgentDirectory['presenceOf']>) { return this.parts.agents.presenceOf(...a); }
  heartbeatProxy(...a: Parameters<AgentDirectory['heartbeatProxy']>) { return this.parts.agents.heartbeatProxy(...a); }
  removeProxy(...a: Parameters<AgentDirectory['removeProxy']>) { return this.parts.agents.removeProxy(...a); }
  listProxies(...a: Parameters<AgentDirectory['listProxies']>) { return this.parts.agents.listProxies(...a); }
  tunnelStrategy(...a: Parameters<AgentDirectory['tunnelStrategy']>) { return this.parts.agents.tunnelStrategy(...a); }
  setTunnelStrategy(...a: Parameters<AgentDirectory['setTunnelStrategy']>) { return this.parts.agents.setTunnelStrategy(...a); }
  watchCluster(...a: Parameters<AgentDirectory['watchCluster']>) { return this.parts.agents.watchCluster(...a); }
  inventory(...a: Parameters<AgentDirectory['inventory']>) { return this.parts.agents.inventory(...a); }
  maintenanceForAgent(...a: Parameters<AgentDirectory['maintenanceForAgent']>) { return this.parts.agents.maintenanceForAgent(...a); }
  watchMaintenance(...a: Parameters<AgentDirectory['watchMaintenance']>) { return this.parts.agents.watchMaintenance(...a); }
  /** For the Proxy (ProxyAuth): read with this process's own authority, as agents read it. */
  maintenanceConfig() { return this.parts.agents.maintenanceForAgent({ kind: 'admin', name: 'proxy', cluster: this.clusterName, roles: [] }); }
  recordAgentEvent(...a: Parameters<AuditLog['recordAgentEvent']>) { return this.parts.audit.recordAgentEvent(...a); }

  // --- the managed rollout (rollout/) ------------------------------------------------------------------------------
  /** Steps the rollout every intervalMs and after every change (until closeRollout). */
  startRollout(intervalMs?: number): void { this.parts.rollout.start(intervalMs); }
  closeRollout(): Promise<void> { return this.parts.rollout.stop(); }
  /** What a host should run now (ProxyAuth: the Proxy answers its upgraders with it). */
  autoupdateInstruction(hostId: string, group?: string) { return this.parts.rollout.instruction(hostId, group); }
  autoupdateStatus(...a: Parameters<RolloutController['status']>) { return this.parts.rollout.status(...a); }
  autoupdateCommand(...a: Parameters<RolloutController['command']>) { return this.parts.rollout.command(...a); }
  /** One step now (tests; the controller steps by itself once started). */
  stepRollout() { return this.parts.rollout.tick(); }
  recordProxyEvent(...a: Parameters<AuditLog['recordProxyEvent']>) { return this.parts.audit.recordProxyEvent(...a); }

  // --- the web: sessions of the browser, the web terminal, app launches (websessions.ts) ---------------------------
  /**
   * A new web session for a user that has just proved who it is (a password on the web, an SSO callback): the
   * secrets and the Set-Cookie value. The page gets the bearer from the answer of a password login, or once with
   * the cookie alone after an SSO redirect (POST /webapi/sessions/bearer).
   */
  createWebSession(identity: Identity, source: string, options: CreateWebSessionOptions = {}): Promise<CreatedWebSession> {
    return this.parts.webSessions.create(identity, source, options);
  }

  /** The web login: the CLI login's password check and limiter, then a web session (audit user.login, method web). */
  async webLogin(username: string, password: string, source: string): Promise<CreatedWebSession & { identity: Identity }> {
    const identity = await this.parts.users.authenticate(username, password, source, 'web');
    const session = await this.parts.webSessions.create(identity, source, { bearerHandout: false });
    await this.parts.audit.record('user.login', undefined, { user: username, source, roles: identity.roles, method: 'web' });
    return { ...session, identity };
  }

  resolveWebSession(id: string, bearer: string | undefined): Promise<WebSessionView> { return this.parts.webSessions.resolve(id, bearer); }
  deleteWebSession(...a: Parameters<WebSessions['delete']>) { return this.parts.webSessions.delete(...a); }
  handoutWebBearer(...a: Parameters<WebSessions['handoutBearer']>) { return this.parts.webSessions.handoutBearer(...a); }
  webSessionSshCert(id: string, bearer: string | undefined, sshPublicKey: string): Promise<{ ssh_cert: string }> { return this.parts.webSessions.sshCert(id, bearer, sshPublicKey); }
  createAppLaunch(id: string, bearer: string | undefined, app: string, state: string): Promise<{ token: string }> { return this.parts.webSessions.createAppLaunch(id, bearer, app, state); }
  redeemAppLaunch(token: string, app: string, state: string): Promise<{ sessionId: string; expiresAt: number }> { return this.parts.webSessions.redeemAppLaunch(token, app, state); }
  resolveAppSession(sessionId: string, app: string): Promise<WebSessionView> { return this.parts.webSessions.resolveAppSession(sessionId, app); }
  webAcl(...a: Parameters<WebSessions['acl']>) { return this.parts.webSessions.acl(...a); }
  /** The newest audit events first, at most limit (the caller needs event list). */
  async listEvents(caller: Identity, limit: number) {
    await this.parts.callers.authorize(caller, 'event', 'list');
    return (await this.parts.audit.list()).slice(-limit).reverse();
  }
}
