/**
 * What the Proxy uses of the Auth Service, and nothing more: the cluster's public trust anchors, the caller
 * checks it makes on every connection it routes, the agent records its tunnel server keeps, and its own web
 * certificate. The in-process AuthService implements it; a Proxy in its own process gets a client of a remote
 * Auth Service implementing the same, so nothing here may hand out a private key.
 */
import type { GatewayError } from '../errors.js';
import type { AgentInstruction, RolloutStatus } from '../wire/autoupdate.js';
import type { CertBundle } from './authorities.js';
import type { RenewRequest } from './joining.js';
import type { Identity } from './pki.js';
import type { NodeRecord, Presence, ProxyRecord, TunnelStrategy } from './records.js';
import type { Resource, RoleResource } from './resources/index.js';
import type { SessionRegistry } from './sessions.js';
import type { AuthPreference } from './sso/index.js';
import type { WebSessionView } from './websessions.js';

export type { WebSessionView } from './websessions.js';

/** A certificate authority as a Proxy sees it: its certificate and SSH public key. */
export interface PublicAuthority {
  readonly tls: { readonly certPem: string };
  readonly ssh: { readonly publicKey: string };
}

/** What tells whether a peer's certificate is from this cluster, and of which kind. */
export interface ClusterTrust {
  readonly clusterName: string;
  readonly host: PublicAuthority;
  readonly user: PublicAuthority;
}

/** The caller as it stands now (a removed or locked identity is refused), and what it has open. */
export interface CallerChecks {
  /** Sessions opened for identities; a lock or a deletion closes them. */
  readonly sessions: SessionRegistry;
  resolveCaller(caller: Identity): Promise<Identity>;
  /** A user named by an SSH certificate, with its stored roles. */
  resolveSshUser(name: string, issuedAt?: number): Promise<Identity>;
  rolesOf(names: readonly string[]): Promise<RoleResource[]>;
  /** Why an identity may no longer keep what it has open, or undefined. */
  revocationOf(identity: Identity): Promise<GatewayError | undefined>;
}

/** What the tunnel server reads and writes about agents. */
export interface AgentRecords {
  getNode(hostId: string): Promise<NodeRecord | undefined>;
  /** Every agent that joined (its node record), online or not: the Web UI's agents view lists the offline ones. */
  listNodes(): Promise<NodeRecord[]>;
  setPresence(presence: Presence, ttlMs: number): Promise<void>;
  /** With connectedAt: only the record of that tunnel (a newer one of the same agent on this Proxy stays). */
  clearPresence(hostId: string, proxyId: string, connectedAt?: string): Promise<void>;
  /**
   * An event an agent whose tunnel this Proxy holds reported (via: this Proxy's ID; a remote Auth Service takes the
   * caller's). Only kinds an agent may report (audit.ts REPORTABLE_EVENTS): GW_ERR_MEMBER_EVENT_REFUSED otherwise.
   */
  recordAgentEvent(hostId: string, nodename: string, event: Record<string, unknown>, via?: string): Promise<void>;
  /**
   * A session this Proxy carried (src/proxy/sessionaudit.ts), recorded as reported by proxyId: REPORTABLE_EVENTS.proxy
   * only. Through the Auth API the Proxy is the one its certificate names (proxyId is not sent).
   */
  recordProxyEvent(proxyId: string, event: Record<string, unknown>): Promise<void>;
  /** Fresh certificates for an agent whose tunnel this Proxy authenticated (its host ID), for the key it joined with. */
  renewHost(request: RenewRequest): Promise<CertBundle & { hostId: string }>;
  /** Calls onChange after every change of cluster_maintenance_config; returns the unsubscribe function. */
  watchMaintenance(onChange: () => void): () => void;
  /** The cluster_maintenance_config resource, or undefined when none is set (the Web UI's agents view). */
  maintenanceConfig(): Promise<Resource | undefined>;
  /**
   * What a host should run in the managed rollout (src/auth/rollout/), for the Proxy's public answer to upgraders.
   * Optional: without it the Proxy does not serve that path (404, as a Proxy of an earlier version).
   */
  autoupdateInstruction?(hostId: string, group?: string): Promise<AgentInstruction>;
  /**
   * The managed rollout for the Web UI's panel, asked after the Proxy checked its user's rule: in process with the
   * user's identity (checked again), through the Auth API as the Proxy. Absent: an Auth Service of an earlier version.
   */
  autoupdateStatus?(caller?: Identity): Promise<RolloutStatus>;
}

/** A change of an agent's presence on one Proxy. */
export type PresenceEvent = { type: 'put'; presence: Presence } | { type: 'delete'; hostId: string; proxyId: string };

export interface ClusterWatchHandlers {
  presence(event: PresenceEvent): void;
  /** A Proxy record or the tunnel strategy changed: list them again. */
  proxies(): void;
  /** Events may have been missed (a gap in the change log, a reconnect to a remote Auth Service): list everything again. */
  resync(): void;
}

/** The cluster's Proxies and where its agents are: what a Proxy needs to tell agents about the others and to reach agents it does not hold. */
export interface ProxyDirectory {
  heartbeatProxy(record: ProxyRecord, ttlMs: number): Promise<void>;
  removeProxy(id: string): Promise<void>;
  listProxies(): Promise<ProxyRecord[]>;
  listPresence(): Promise<Presence[]>;
  tunnelStrategy(): Promise<TunnelStrategy>;
  /** Returns the unsubscribe function. */
  watchCluster(handlers: ClusterWatchHandlers): () => void;
}

export interface ProxyAuth extends ClusterTrust, CallerChecks, AgentRecords, ProxyDirectory {
  /** How users sign in (auth_service.authentication with its connector's display name), for /webapi/ping. */
  authPreference(): Promise<AuthPreference>;

  /** A certificate for the Proxy's web port, signed by the host CA, naming names. */
  issueServerCert(publicKeyPem: string, names: string[], hostId?: string): Promise<string>;

  // --- the web (src/auth/websessions.ts) ----------------------------------------------------------------------------
  /**
   * The caller of a web session (cookie id + bearer of the SAME session), as it stands now: GW_ERR_WEB_SESSION_*
   * when the pair is missing, wrong or expired, and refused as for certificates when the user was removed or is
   * locked. A bearer of undefined is always refused (app sessions have their own call).
   */
  resolveWebSession(id: string, bearer: string | undefined): Promise<WebSessionView>;
  /** An SSH user certificate for the session's user (principals: its logins), until min(session end, 1 h). */
  webSessionSshCert(id: string, bearer: string | undefined, sshPublicKey: string): Promise<{ ssh_cert: string }>;
  /** A launch token for app (single use, 60 s), bound to the launch nonce state. The Proxy checks the user may reach the app first. */
  createAppLaunch(id: string, bearer: string | undefined, app: string, state: string): Promise<{ token: string }>;
  /** Spends a launch token bound to state: an app session bound to app and to its parent web session (which ends it). */
  redeemAppLaunch(token: string, app: string, state: string): Promise<{ sessionId: string; expiresAt: number }>;
  /** The caller of an app session (the `__Host-gw_app` cookie) for app, while its parent web session lives. */
  resolveAppSession(sessionId: string, app: string): Promise<WebSessionView>;
}
