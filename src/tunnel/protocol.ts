/**
 * The reverse tunnel's messages, and how two protocols carry them (the ALPN on the one port decides which):
 *
 *   v2 (ALPN gateway-reversetunnel-v2): frames straight over the mutual-TLS connection (src/tunnel/frames.ts,
 *      session.ts). The agent is its TLS client certificate. The control channel is stream 0; each forwarded
 *      connection is a stream the Proxy OPENs, whose first line is a DialRequest, as below. A refused agent
 *      gets `refused` on the control stream, and the connection ends.
 *   v1 (ALPN gateway-reversetunnel, and raw SSH on 3024), agents of earlier versions, as follows.
 *
 * v1 maps the tunnel onto standard SSH (ssh2 opens only the standard channel types):
 *
 *   agent ──SSH (over TLS with ALPN gateway-reversetunnel on 443, or raw on 3024)──► proxy
 *     user name = the agent's host ID; public-key authentication with the key its host certificate certifies
 *
 *   control: a "session" channel with subsystem "gateway-control", newline-delimited JSON both ways
 *     agent → proxy   hello {hostId, nodename, services, resources, version, holds?, drain_previous?,
 *                            software_version?, upgrade_channel?}   heartbeat {seq}   event {event}
 *                     renew {id, public_key, proof}   (fresh host certificates for the key it joined with; a Proxy of an
 *                            earlier version ignores it and the agent asks again later)
 *                     host-cert {ssh_cert}   (after a renewal: its new SSH host certificate, for the Proxy's copy
 *                            of its resources; the Proxy checks it against the host CA and the tunnel's host)
 *     proxy → agent   welcome {proxyId, heartbeatIntervalMs, heartbeatCountMax}  discovery {proxies, strategy}
 *                     heartbeat {seq}   reconnect {reason}   (sent when the proxy shuts down gracefully)
 *                     maintenance-changed
 *                     renewal {id, certs: {tls_cert, ssh_cert}} or {id, error: {code, message, hint?}}   (the
 *                            answer to the renew of that id)
 *                     duplicate {proxyId}   (instead of a welcome: the hello's holds names this Proxy, which
 *                     already has a live tunnel of the agent; the proxy then closes the new connection)
 *     The Proxy a tunnel reached is the host ID in its welcome (or duplicate): how an agent behind a load
 *     balancer tells Proxies apart (src/agent/pool.ts).
 *     A line longer than CONTROL_MAX_LINE_BYTES is a protocol error: the receiver closes the tunnel. A line
 *     that is not a JSON object, or a message of a type the receiver does not know or with fields of other
 *     types than declared here, is ignored (src/tunnel/control.ts enforces both).
 *
 *   each forwarded connection: the agent asks once for "tcpip-forward" of TUNNEL_BIND; the proxy then opens a
 *     "forwarded-tcpip" channel per client connection. Its first line is a DialRequest (JSON); the agent answers
 *     one line, DialAnswer, then the channel carries the connection's bytes both ways.
 *
 *   a probe (`gwctl probe`, on either protocol): a DialRequest with probe: true. The agent only checks that the
 *     resource answers (a TCP connect, closed at once: resourceReach in src/agent/resources.ts), never passes a
 *     byte of it, answers DialAnswer, then one ProbeReport line, and ends the stream. An agent of an earlier
 *     version ignores the flag and dials as for a user: its answer has no ProbeReport line after it, and the
 *     Proxy closes the stream at once (src/proxy/probe.ts says "agent of an earlier version").
 */
import type { DatabaseProtocol } from '../wire/protocols.js';
import type { AgentHealth } from '../wire/autoupdate.js';
import type { KubeAccess } from '../wire/kubeimpersonate.js';

/** The ALPN names of the two protocols on the one port (the wire table's tunnel row); an agent offers both, v2 first. */
export { TUNNEL_ALPN_V1, TUNNEL_ALPN_V2 } from '../wire/protocols.js';

export const CONTROL_SUBSYSTEM = 'gateway-control';
export const TUNNEL_BIND = { addr: 'gateway-tunnel', port: 1 } as const;
export const PROTOCOL_VERSION = 1;
/** The longest control line either end reads (the hello is a dial-request-sized line, see stream/lines.ts). */
export const CONTROL_MAX_LINE_BYTES = 1024 * 1024;

export type ServiceKind = 'ssh' | 'db' | 'app' | 'desktop' | 'kube';

/**
 * The system role (a join token's type, carried by the host certificate and the node record) that lets a host
 * serve each service: what the Proxy requires of an agent's tunnel for the services its hello names, and of a
 * direct-join agent's listener it dials (docs/security.md, "Who each cluster member is").
 */
export const SERVICE_ROLE: Readonly<Record<ServiceKind, string>> = { ssh: 'node', db: 'db', app: 'app', desktop: 'desktop', kube: 'kube' };

/**
 * Why a host with these roles may not hold an agent's tunnel for these services, or undefined: it has no agent
 * role at all (a Proxy's or the Auth Service's identity is not an agent's), or a service its roles do not allow.
 */
export function servicesRefusal(roles: readonly string[], services: readonly string[]): string | undefined {
  const agentRoles: readonly string[] = Object.values(SERVICE_ROLE);
  if (!roles.some((r) => agentRoles.includes(r))) return `it joined as ${roles.join(', ') || 'nothing'}, not as an agent`;
  for (const service of services) {
    const role = (SERVICE_ROLE as Record<string, string | undefined>)[service];
    if (role === undefined || !roles.includes(role)) {
      return `it joined as ${roles.join(', ') || 'nothing'}, which does not serve ${String(service).slice(0, 32)}${role ? ` (that needs ${role})` : ''}`;
    }
  }
  return undefined;
}

/**
 * The longest a drained tunnel (one an agent replaced by moving to a better transport) stays open for the streams
 * in flight on it, on both ends; then it is closed with what is left.
 */
export const TUNNEL_DRAIN_CAP_MS = 10 * 60_000;
/** The longest drain a hello's drain_ms obtains (a day): a lying agent cannot keep its old tunnels for ever. */
export const TUNNEL_HANDOVER_DRAIN_MAX_MS = 24 * 3600_000;
/** The most tunnels of one agent a Proxy keeps draining at once; beyond it the oldest is closed. */
export const TUNNEL_DRAINING_PER_AGENT_MAX = 4;

export interface DatabaseInfo {
  name: string;
  protocol: DatabaseProtocol;
  labels: Record<string, string>;
}
export interface AppInfo {
  name: string;
  /** http, https or tcp. */
  kind: 'http' | 'https' | 'tcp';
  public_addr?: string;
  labels: Record<string, string>;
}
export interface DesktopInfo {
  name: string;
  labels: Record<string, string>;
}
export interface KubeClusterInfo {
  name: string;
  labels: Record<string, string>;
}

export interface AgentResources {
  databases: DatabaseInfo[];
  apps: AppInfo[];
  desktops: DesktopInfo[];
  kube_clusters: KubeClusterInfo[];
  /** The SSH Service's node labels, when the agent runs one. */
  node_labels?: Record<string, string>;
  /** The SSH Service's host certificate (OpenSSH line): clients check it before trusting the node's key. */
  node_host_cert?: string;
}

export interface HelloMessage {
  type: 'hello';
  version: number;
  hostId: string;
  nodename: string;
  services: ServiceKind[];
  resources: AgentResources;
  /**
   * The Proxies (host IDs) this agent already holds a tunnel to (its pool's other tunnels). A Proxy named here
   * that holds a live tunnel of the agent keeps it and answers `duplicate`; absent: the new tunnel replaces it.
   */
  holds?: string[];
  /**
   * This tunnel is the agent moving to a better transport (src/agent/ladder.ts): the tunnel it replaces on this
   * Proxy is drained, not cut: no new stream goes to it, the streams in flight finish, and it is closed once they
   * have or after TUNNEL_DRAIN_CAP_MS. Absent: the old tunnel is closed at once, as before.
   */
  drain_previous?: boolean;
  /**
   * With drain_previous: how long the replaced tunnel may drain, in ms (a new process taking over from the one
   * before: its gateway.drain_limit, src/handover.ts). The Proxy keeps it within [1 s, TUNNEL_HANDOVER_DRAIN_MAX_MS]
   * and ignores anything that is not a number; absent: TUNNEL_DRAIN_CAP_MS.
   */
  drain_ms?: number;
  /** The agent's software version ("1.4.0", src/version.ts); absent from agents of earlier versions. */
  software_version?: string;
  /**
   * The upgrade channel of the agent's upgrader: the channel its endpoint file names
   * (/etc/gateway-upgrade.d/endpoint), or "default" without one. Absent from agents of earlier versions.
   */
  upgrade_channel?: string;
  /**
   * This agent sends presence-proof messages after the welcome: the Proxy writes its presence with the first one
   * (not before: a remote Auth Service refuses an unsigned presence of an agent that has signed before).
   */
  signs_presence?: boolean;
  /**
   * The agent's rollout group (issue 28: its config's gateway.upgrade_group, else its `upgrade-group` label); absent:
   * none (the rollout's catch-all decides). At most HELLO_SOFTWARE_MAX characters, [a-z0-9-].
   */
  upgrade_group?: string;
  /**
   * The agent takes end-to-end streams (src/tunnel/e2e.ts) and keeps `pool` idle data connections to this Proxy.
   * Only on a v2 tunnel; absent: an agent of an earlier version, or one with gateway.e2e_pool 0.
   */
  e2e?: E2ECapability;
}
/** The longest software_version / upgrade_channel a Proxy keeps from a hello (longer ones are dropped). */
export const HELLO_SOFTWARE_MAX = 128;
export interface HeartbeatMessage {
  type: 'heartbeat';
  seq: number;
}
/**
 * Agent → proxy, after the welcome and whenever it changes (at most once per heartbeat interval): the agent's own
 * measure of its health, which the Proxy keeps in its presence (bounded) for the rollout's canaries.
 */
export interface HealthMessage {
  type: 'health';
  health: AgentHealth;
}
export interface WelcomeMessage {
  type: 'welcome';
  proxyId: string;
  heartbeatIntervalMs: number;
  heartbeatCountMax: number;
}
export interface DiscoveryMessage {
  type: 'discovery';
  /** Every live Proxy of the cluster (its host ID, and its public address: often the load balancer's, shared). */
  proxies: Array<{ id: string; addr: string }>;
  /**
   * auth_service.tunnel_strategy: agent_mesh, a tunnel to every Proxy listed; proxy_peering, to
   * agent_connection_count of them. Absent from Proxies of older versions: agent_mesh.
   */
  strategy?: { type: 'agent_mesh' } | { type: 'proxy_peering'; agent_connection_count: number };
}
/** Proxy → agent: cluster_maintenance_config changed; the agent re-exports its upgrade schedule. */
export interface MaintenanceChangedMessage {
  type: 'maintenance-changed';
}
/** Proxy → agent, instead of a welcome: this Proxy already holds the tunnel the hello's holds names. */
export interface DuplicateMessage {
  type: 'duplicate';
  proxyId: string;
}
/** Proxy → agent on v2, instead of a welcome: the agent's certificate, host or key was refused (the Proxy logs why). */
export interface RefusedMessage {
  type: 'refused';
}
export interface ReconnectMessage {
  type: 'reconnect';
  reason: string;
}
/** An audit event from the agent (SSH sessions), stored by the Proxy in the cluster's backend. */
export interface EventMessage {
  type: 'event';
  event: Record<string, unknown>;
}
/** Agent → Proxy: fresh host certificates for this public key (PEM), the one the agent joined with. */
export interface RenewMessage {
  type: 'renew';
  id: number;
  public_key: string;
  /** The host's proof that it holds the key (src/auth/pki/proof.ts); the Auth Service needs it for an ask a Proxy carries. */
  proof?: { time: string; signature: string };
}
/** The longest public_key a renew may carry (a P-256 SPKI PEM is 178 bytes). */
export const RENEW_KEY_MAX = 8192;
/** Agent → Proxy: its renewed SSH host certificate (OpenSSH line), for node_host_cert of its resources. */
export interface HostCertMessage {
  type: 'host-cert';
  ssh_cert: string;
}
/**
 * Agent → Proxy: its signature of its presence through this Proxy (src/auth/pki/proof.ts signPresenceProof), after
 * the welcome and every PRESENCE_PROOF_EVERY_MS; the Proxy carries the newest with the presence it writes, and a
 * remote Auth Service checks it. Proxies of earlier versions ignore it.
 */
export interface PresenceProofMessage {
  type: 'presence-proof';
  proxyId: string;
  time: string;
  signature: string;
}
/** The longest ssh_cert a host-cert may carry. */
export const HOST_CERT_MAX = 16 * 1024;
/** Proxy → agent: the answer to the renew with the same id: the certificates, or why not. */
export interface RenewalMessage {
  type: 'renewal';
  id: number;
  certs?: { tls_cert: string; ssh_cert: string };
  error?: { code: string; message: string; hint?: string };
}
/** The hello's capability: the agent takes end-to-end streams and keeps this many idle data connections. */
export interface E2ECapability {
  v: 1;
  pool: number;
  /**
   * The agent serves end-to-end Kubernetes streams as they must be served: reading the HTTP itself and setting the
   * impersonation from the grant's kube_access (src/agent/kubeapi.ts). A Proxy gives kube grants only to an agent
   * that says so: an agent of the version before would serve one with its own credential and the client's own
   * Impersonate-* headers.
   */
  kube?: true;
  /**
   * The agent takes a grant of a Proxy it holds no tunnel to, by the grant's own issuer certificate (Proxy peering:
   * src/auth/grantissuer.ts). A Proxy grants for an agent it reaches over peering only when it says so: an agent of
   * the version before would refuse such a grant inside the TLS, which the client could not fall back from.
   */
  peered?: true;
  /**
   * The agent takes an end-to-end stream on a stream of its tunnel, whose first line is an E2EOpenMessage with conn
   * E2E_CONN_TUNNEL (src/tunnel/e2e.ts): what the Proxy does when no data connection of the agent waits there (a
   * Proxy the balancer has not sent one to yet, a sticky balancer). The bytes stay the client's TLS with the agent.
   * An agent of the version before would read that line as a dial request and refuse it: the Proxy waits for a data
   * connection instead.
   */
  stream?: true;
}
/**
 * Proxy → agent on the control stream: data connection `conn` now carries the stream of `grant` (declared here
 * with the other control messages; src/tunnel/e2e.ts is its contract and checks it: badE2EOpen).
 */
export interface E2EOpenMessage {
  type: 'e2e-open';
  /** The n of the data connection's preamble; E2E_CONN_TUNNEL (0): the tunnel stream whose first line this is. */
  conn: number;
  grant: string;
  /** The client's address as the Proxy saw it, "ip:port", and the address it connected to. */
  client_src: string;
  client_dst: string;
  traceparent?: string;
  tracestate?: string;
}
/**
 * Proxy → agent: users whose identity the Proxy found revoked (a lock on the user or one of its roles, the user
 * removed) while they had an end-to-end stream to this agent: the agent closes their open end-to-end streams and
 * refuses their grants for LOCKED_USER_HOLD_MS (src/agent/e2estream.ts). At most LOCKS_MESSAGE_MAX_USERS names.
 */
export interface LocksMessage {
  type: 'locks';
  users: string[];
  /** Why, as the Proxy's revocation said it (for the agent's log). */
  reason?: string;
  /**
   * When the Proxy found them revoked (ms, the Proxy's clock: the one grants' `iat` is on). The agent refuses their
   * grants issued until then; a grant issued after it was signed by a Proxy that checked the locks again (unlocked).
   */
  at?: number;
}
export const LOCKS_MESSAGE_MAX_USERS = 1024;
export type ControlMessage =
  | HelloMessage
  | E2EOpenMessage
  | LocksMessage
  | HeartbeatMessage
  | WelcomeMessage
  | DiscoveryMessage
  | ReconnectMessage
  | EventMessage
  | MaintenanceChangedMessage
  | DuplicateMessage
  | RefusedMessage
  | RenewMessage
  | RenewalMessage
  | HostCertMessage
  | PresenceProofMessage
  | HealthMessage;

export interface DialRequest {
  service: ServiceKind;
  /** Database, app, desktop or kube cluster name; for ssh, the login and port ("root@22"). */
  resource: string;
  /** The client's address as the proxy saw it, "ip:port". */
  client_src: string;
  /** The address the client connected to, "ip:port". */
  client_dst: string;
  /** Who asked (for the agent's own logs). */
  user?: string;
  /**
   * service db: the database users and names the user's roles allow now (the Proxy's decision, from the roles
   * and traits as they stand: src/auth/rbac.ts databaseGrant). The agent checks what the client asks for in the
   * protocol's own startup against it (src/agent/dbgate.ts); a db dial without it is refused.
   */
  db_access?: DatabaseGrant;
  /**
   * service kube, end-to-end streams only (src/agent/e2estream.ts, from the grant): the Kubernetes users and groups
   * the roles allow. With it the agent serves the stream as HTTP itself, takes requests under /k8s/<resource>/ (the
   * path gwsh proxy kube's kubeconfig gives), and sets Impersonate-User/-Group from it (src/wire/kubeimpersonate.ts)
   * in place of any the client sent; without it (the classic route) the Proxy has done that.
   */
  kube_access?: KubeAccess;
  /**
   * A direct-join listener only: the Proxy asks for the bytes in frames that say their end (src/stream/framed.ts);
   * an agent that takes it answers `framed` too. A tunnel channel needs none: its own end and reset are frames.
   */
  framed?: boolean;
  /** A probe: check the resource answers (connect and close), pass no byte of it; a ProbeReport line follows the answer. */
  probe?: boolean;
  /**
   * W3C trace context of the hop that dials (src/trace.ts): the agent's span is its child. Validated by the
   * receiver (traceContextOf: exactly the 55 characters of version 00, ids not zero; a tracestate over 512 bytes
   * dropped) and dropped when not valid; an agent of an earlier version ignores both.
   */
  traceparent?: string;
  tracestate?: string;
}

/**
 * The line after a probe's {"ok":true}: the agent's time to connect to the resource, in ms. A Proxy a peer asked
 * writes its own line first ({"hop":"peer-tunnel", ...}): the time its tunnel dial took, the agent's check included.
 */
export interface ProbeReport {
  hop: 'resource' | 'peer-tunnel';
  ms: number;
  detail?: string;
}
/** The longest ProbeReport line a Proxy reads. */
export const PROBE_REPORT_MAX_BYTES = 1024;

/** Allowed and denied values of one field (db_users or db_names): `*` stands for any value; deny wins. */
export interface GrantList {
  allow: string[];
  deny: string[];
}
export interface DatabaseGrant {
  users: GrantList;
  names: GrantList;
}
/** The most values a GrantList may carry on the wire (either list), and the longest value. */
export const GRANT_MAX_VALUES = 1024;
export const GRANT_MAX_VALUE_BYTES = 253;

/** A DatabaseGrant from untrusted JSON, or undefined when it is not one (wrong types, over the caps). */
export function databaseGrantOf(value: unknown): DatabaseGrant | undefined {
  const list = (v: unknown): string[] | undefined =>
    Array.isArray(v) && v.length <= GRANT_MAX_VALUES && v.every((x) => typeof x === 'string' && x.length > 0 && x.length <= GRANT_MAX_VALUE_BYTES) ? [...(v as string[])] : undefined;
  const field = (v: unknown): GrantList | undefined => {
    if (typeof v !== 'object' || v === null) return undefined;
    const allow = list((v as Record<string, unknown>).allow);
    const deny = list((v as Record<string, unknown>).deny);
    return allow && deny ? { allow, deny } : undefined;
  };
  if (typeof value !== 'object' || value === null) return undefined;
  const users = field((value as Record<string, unknown>).users);
  const names = field((value as Record<string, unknown>).names);
  return users && names ? { users, names } : undefined;
}

/** Whether a grant list allows value: some allow entry is value or `*`, and no deny entry is. */
export function grantAllows(list: GrantList, value: string): boolean {
  const hit = (entries: readonly string[]) => entries.some((e) => e === '*' || e === value);
  return !hit(list.deny) && hit(list.allow);
}

export type DialAnswer = { ok: true; framed?: boolean } | { ok: false; error: { code: string; message: string } };
