/**
 * The resolved configuration: a plain object, every field present (defaults filled in), deeply frozen.
 * schema.ts declares the same shape as a field table; a compile-time check there keeps the two in step.
 *
 * Addresses are stored parsed: listen addresses as HostPort ({host, port}: ":3025" gives host 0.0.0.0, a host
 * alone gets the field's default port, port 0 means "any free port"); public addresses as lists of HostPort
 * (the field's default port filled in), or of ParsedAddr (port undefined when not written) for the Database and
 * Application Services, which have no port of their own. formatHostPort() from src/addr.ts turns them back into
 * "host:port" text.
 */
import type { HostPort, ParsedAddr } from '../addr.js';
import type { LogFormat } from '../log.js';

export type LogSeverity = 'trace' | 'debug' | 'info' | 'warn' | 'error';

export interface LogConfig {
  /** 'stderr', 'stdout' or an absolute file path. */
  readonly output: string;
  readonly severity: LogSeverity;
  /** undefined: text on a terminal, JSON otherwise (as createLogger() decides). */
  readonly format: LogFormat | undefined;
}

export interface ProcessConfig {
  readonly nodename: string;
  /** Absolute path. */
  readonly data_dir: string;
  readonly log: LogConfig;
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
}

/** Exactly one of the two is set. static_version keeps its leading "v". */
export interface UpgradeChannelConfig {
  readonly static_version: string | undefined;
  readonly forward_url: string | undefined;
}

export interface ProxyServiceConfig extends ServiceConfig {
  readonly web_listen_addr: HostPort;
  readonly tunnel_listen_addr: HostPort;
  readonly listen_addr: HostPort;
  readonly peer_listen_addr: HostPort;
  readonly mysql_listen_addr: HostPort;
  readonly postgres_listen_addr: HostPort;
  readonly mongo_listen_addr: HostPort;
  readonly redis_listen_addr: HostPort;
  /** undefined: no Kubernetes listener of its own. */
  readonly kube_listen_addr: HostPort | undefined;
  readonly ssh_public_addr: readonly HostPort[];
  readonly tunnel_public_addr: readonly HostPort[];
  readonly kube_public_addr: readonly HostPort[];
  readonly postgres_public_addr: readonly HostPort[];
  readonly mysql_public_addr: readonly HostPort[];
  readonly mongo_public_addr: readonly HostPort[];
  /** Channel name (may contain "/") → channel. The built-in `default` channel is not listed unless overridden. */
  readonly automatic_upgrades_channels: Readonly<Record<string, UpgradeChannelConfig>>;
}

export interface ListeningAgentConfig extends ServiceConfig {
  readonly listen_addr: HostPort;
}

/** The Database and Application Services use reverse tunnels only: no listener, public_addr ports optional. */
export type TunnelAgentConfig = ServiceConfig<ParsedAddr>;

export interface GatewayConfig {
  readonly gateway: ProcessConfig;
  readonly auth_service: AuthServiceConfig;
  readonly proxy_service: ProxyServiceConfig;
  readonly ssh_service: ListeningAgentConfig;
  readonly db_service: TunnelAgentConfig;
  readonly app_service: TunnelAgentConfig;
  readonly kube_service: ListeningAgentConfig;
  readonly windows_desktop_service: ListeningAgentConfig;
}

export type ServiceName = Exclude<keyof GatewayConfig, 'gateway'>;
