/**
 * The gateway configuration file: YAML → validated, deeply frozen GatewayConfig. The keys, types, defaults and
 * rules are declared once in schema.ts; docs/configuration.md is the reference for users.
 */
export { defaultConfig, enabledServices, loadConfigFile, parseConfig } from './parse.js';
export { sampleConfig } from './sample.js';
export { DEFAULT_SERVICES, SCHEMA, SERVICE_NAMES } from './schema.js';
export type {
  AppConfig,
  AppServiceConfig,
  DatabaseConfig,
  DatabaseProtocol,
  DatabaseServiceConfig,
  DesktopConfig,
  KubeClusterConfig,
  KubeServiceConfig,
  Labels,
  SshServiceConfig,
  WindowsDesktopServiceConfig,
  AuthServiceConfig,
  GatewayConfig,
  ListeningAgentConfig,
  LimitsConfig,
  LogConfig,
  LogSeverity,
  ProcessConfig,
  ProxyServiceConfig,
  ServiceConfig,
  ServiceName,
  StorageConfig,
  TunnelAgentConfig,
  UpgradeChannelConfig,
  AutoupdateArtifactsConfig,
} from './types.js';
