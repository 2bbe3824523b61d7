/**
 * The resolved configuration: a plain object, every field present (defaults filled in), deeply frozen.
 * schema.ts declares the same shape as a field table; a compile-time check there keeps the two in step.
 *
 * Addresses are stored parsed: listen addresses as HostPort ({host, port}: ":3025" gives host 0.0.0.0, a host
 * alone gets the field's default port, port 0 means "any free port"); public addresses as lists of HostPort
 * (the field's default port filled in), or of ParsedAddr (port undefined when not written) for the Database and
 * Application Services, which have no port of their own. formatHostPort() from src/addr.ts turns them back into
 * "host:port" text.
 *
 * Agents' resources (databases, apps, desktops, Kubernetes clusters) are read-only lists, empty by default; in each
 * item the keys the file must set (name, uri, ...) are never undefined, since an item missing one is an error.
 */
import type { HostPort, ParsedAddr } from '../addr.js';
import type { LogFormat } from '../log.js';
import type { TracingConfig } from '../trace.js';
import type { DatabaseProtocol, ListenAddrKey, OptionalListenAddrKey, PublicAddrKey } from '../wire/protocols.js';

export type LogSeverity = 'trace' | 'debug' | 'info' | 'warn' | 'error';

export interface LogConfig {
  /** 'stderr', 'stdout' or an absolute file path. */
  readonly output: string;
  readonly severity: LogSeverity;
  /** undefined: text on a terminal, JSON otherwise (as createLogger() decides). */
  readonly format: LogFormat | undefined;
}

export type { LimitsConfig } from '../net/deadlines.js';
import type { LimitsConfig } from '../net/deadlines.js';

/**
 * Where the Auth Service keeps the cluster state (docs/backend.md). sqlite: <data_dir>/backend.sqlite; postgres:
 * the database of conn_string, with the TLS files (absolute paths) when set. The rest is undefined for sqlite.
 */
export interface StorageConfig {
  readonly type: 'sqlite' | 'postgres';
  /** As written (it may hold a password: show it only through redactUrl). */
  readonly conn_string: string | undefined;
  readonly ca_file: string | undefined;
  readonly cert_file: string | undefined;
  readonly key_file: string | undefined;
}

export interface ProcessConfig {
  readonly nodename: string;
  /** The health endpoints' listener (src/net/diag.ts); undefined: none. */
  readonly diag_addr: HostPort | undefined;
  /** Agents: how long sessions in flight may go on in a process handing over or stopping (ms). */
  readonly drain_limit: number;
  /** SIGTERM drains an agent's sessions before it stops (the chart's Deployment); else it stops at once. */
  /** Idle data connections per v2 tunnel for end-to-end streams (0: off). */
  readonly e2e_pool: number;
  readonly drain_on_stop: boolean;
  /** Absolute path. */
  readonly data_dir: string;
  /** The agent's rollout group (hello.upgrade_group); undefined: its ssh_service `upgrade-group` label, else none. */
  readonly upgrade_group: string | undefined;
  /** Milliseconds after which the upgrader's last run counts as stale. */
  readonly upgrade_stale_after: number;
  /** Auth API addresses of a Proxy-only process (docs/configuration.md). */
  readonly auth_server: readonly HostPort[];
  /** The root CA of a TLS-inspecting proxy (absolute path), for the upgrade transport (src/dial/upgrade.ts). */
  readonly proxy_ca_file: string | undefined;
  /** Traces over OTLP (src/trace.ts tracingSettings); every field undefined: the environment decides. */
  readonly tracing: TracingConfig;
  readonly storage: StorageConfig;
  readonly log: LogConfig;
  readonly limits: LimitsConfig;
}

/** What every service section has. */
export interface ServiceConfig<A extends ParsedAddr = HostPort> {
  /** Whether `gateway start` runs this service (see "Which services run" in docs/configuration.md). */
  readonly enabled: boolean;
  readonly public_addr: readonly A[];
}

export interface AuthServiceConfig extends ServiceConfig {
  readonly cluster_name: string;
  readonly listen_addr: HostPort;
  readonly proxy_listener_mode: 'multiplex' | 'separate';
  /** Milliseconds between heartbeats on a reverse tunnel. */
  readonly keep_alive_interval: number;
  /** Heartbeats missed in a row (1..100) before the Proxy marks an agent offline. */
  readonly keep_alive_count_max: number;
  readonly tunnel_strategy: { readonly type: 'agent_mesh' | 'proxy_peering'; readonly agent_connection_count: number };
  /** How users sign in (docs/sso.md): local, or the connector of that kind named connector_name ('' = the first). */
  readonly authentication: { readonly type: 'local' | 'oidc' | 'saml' | 'github'; readonly connector_name: string };
  /** Milliseconds between two steps of the managed rollout's controller (src/auth/rollout/controller.ts). */
  readonly autoupdate_interval: number;
}

/** Exactly one of the two is set. static_version keeps its leading "v". */
export interface UpgradeChannelConfig {
  readonly static_version: string | undefined;
  readonly forward_url: string | undefined;
}

/** proxy_service.autoupdate_artifacts: the relay of release artifacts (src/proxy/artifacts.ts). */
export interface AutoupdateArtifactsConfig {
  readonly download_url: string | undefined;
  readonly repo_url: string | undefined;
  /** undefined: <data_dir>/artifacts. */
  readonly cache_dir: string | undefined;
  readonly cache_max_bytes: number;
  /** Milliseconds. */
  readonly fetch_timeout: number;
  /** Milliseconds. */
  readonly fetch_deadline: number;
  /** Milliseconds. */
  readonly index_ttl: number;
  readonly max_fetches: number;
}

/**
 * Each protocol's listen and public addresses in proxy_service, keyed as src/wire/protocols.ts declares them:
 * listeners bound unless off (kube_listen_addr: undefined when not set), public addresses as lists.
 */
export type ProtocolAddrsConfig = { readonly [K in ListenAddrKey]: HostPort } & { readonly [K in OptionalListenAddrKey]: HostPort | undefined } & {
  readonly [K in PublicAddrKey]: readonly HostPort[];
};

export interface ProxyServiceConfig extends ServiceConfig, ProtocolAddrsConfig {
  readonly peer_listen_addr: HostPort;
  readonly peer_public_addr: readonly HostPort[];
  readonly proxy_protocol: 'on' | 'off';
  /** Addresses and CIDR networks (as written) a PROXY header is believed from; empty: any source (src/mux/trust.ts). */
  readonly proxy_protocol_trusted_sources: readonly string[];
  /** Milliseconds. */
  readonly detect_timeout: number;
  /** Empty or undefined: the cluster's host CA issues the web certificate. */
  readonly https_keypairs: readonly { readonly cert_file: string; readonly key_file: string }[];
  readonly autoupdate_artifacts: AutoupdateArtifactsConfig;
  /** Channel name (may contain "/") → channel. The built-in `default` channel is not listed unless overridden. */
  readonly automatic_upgrades_channels: Readonly<Record<string, UpgradeChannelConfig>>;
}

export interface ListeningAgentConfig extends ServiceConfig {
  readonly listen_addr: HostPort;
}

/** The Database and Application Services use reverse tunnels only: no listener, public_addr ports optional. */
export type TunnelAgentConfig = ServiceConfig<ParsedAddr>;

/**
 * Label name → value. Names: letters, digits, ".", "_", "-" and "/", each part between slashes 1 to 63
 * characters; values: at most 256 characters.
 */
export type Labels = Readonly<Record<string, string>>;

export interface SshServiceConfig extends ListeningAgentConfig {
  /** Labels of this node, advertised by the SSH Service. */
  readonly labels: Labels;
  /** The system's sftp-server program for the sftp subsystem; undefined: the built-in one. */
  readonly sftp_server: string | undefined;
}

export type { DatabaseProtocol };

/** Resource names (`name` below): 1-63 of a-z, 0-9 and "-", starting with a letter; unique within their list. */
export interface DatabaseConfig {
  readonly name: string;
  readonly protocol: DatabaseProtocol;
  /** The database server; the port is always written. */
  readonly uri: HostPort;
  readonly labels: Labels;
}

export interface DatabaseServiceConfig extends TunnelAgentConfig {
  readonly databases: readonly DatabaseConfig[];
}

export interface AppConfig {
  readonly name: string;
  /**
   * Normalised: `http://host[:port][/path]`, `https://...` or `tcp://host:port`; scheme and DNS name in lowercase,
   * IPv6 in brackets, the scheme's default port and a lone "/" dropped.
   */
  readonly uri: string;
  /** DNS name (lowercase, no trailing dot) under which the Proxy's web port serves an HTTP app; never set for tcp://. */
  readonly public_addr: string | undefined;
  readonly labels: Labels;
}

export interface AppServiceConfig extends TunnelAgentConfig {
  readonly apps: readonly AppConfig[];
}

export interface KubeClusterConfig {
  readonly name: string;
  /** Normalised https:// URL (see AppConfig.uri). */
  readonly api_server: string;
  /** Absolute path of the API server's CA (PEM); undefined: the system's trusted CAs. */
  readonly ca_file: string | undefined;
  /** How the agent authenticates to the API server (src/agent/kubecreds.ts). */
  readonly credentials: 'none' | 'in_cluster' | 'kubeconfig';
  /** Absolute directory of the service-account token, ca.crt (credentials: in_cluster). */
  readonly service_account_dir: string;
  /** Absolute path of the kubeconfig (credentials: kubeconfig). */
  readonly kubeconfig: string | undefined;
  /** Context in the kubeconfig; undefined: its current-context. */
  readonly kubeconfig_context: string | undefined;
  readonly labels: Labels;
}

export interface KubeServiceConfig extends ListeningAgentConfig {
  readonly clusters: readonly KubeClusterConfig[];
}

export interface DesktopConfig {
  readonly name: string;
  /** Port 3389 unless written. */
  readonly addr: HostPort;
  readonly labels: Labels;
}

export interface WindowsDesktopServiceConfig extends ListeningAgentConfig {
  readonly desktops: readonly DesktopConfig[];
}

export interface GatewayConfig {
  readonly gateway: ProcessConfig;
  readonly auth_service: AuthServiceConfig;
  readonly proxy_service: ProxyServiceConfig;
  readonly ssh_service: SshServiceConfig;
  readonly db_service: DatabaseServiceConfig;
  readonly app_service: AppServiceConfig;
  readonly kube_service: KubeServiceConfig;
  readonly windows_desktop_service: WindowsDesktopServiceConfig;
}

export type ServiceName = Exclude<keyof GatewayConfig, 'gateway'>;
