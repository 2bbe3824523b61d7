/**
 * The configuration file, declared once: every key with its type, default, check and one-line comment.
 * parseConfig() validates against this table, sampleConfig() prints it, and a test checks docs/configuration.md
 * against it. To add a key, add a line here (and a row in the docs; the test tells you if you forget).
 */
import { hostname } from 'node:os';
import { isAbsolute } from 'node:path';
import semver from 'semver';
import { redactUrl } from '../redact.js';
import { Dynamic, Invalid, addrs, flag, listen, mapOf, oneOf, section, str, type Ctx, type Fields, type Infer, type Spec } from './spec.js';
import type { GatewayConfig, ServiceName } from './types.js';

export const SERVICE_NAMES: readonly ServiceName[] = [
  'auth_service',
  'proxy_service',
  'ssh_service',
  'db_service',
  'app_service',
  'kube_service',
  'windows_desktop_service',
];

/** What runs when the file has no service section at all (and what defaultConfig() runs). */
export const DEFAULT_SERVICES: readonly ServiceName[] = ['auth_service', 'proxy_service'];

// --- checks ------------------------------------------------------------------------------------------------------

const quote = (s: string): string => JSON.stringify(s);

function name(what: string) {
  return (s: string): string => {
    const t = s.trim();
    if (t === '' || /[\s\u0000-\u001f\u007f]/.test(t)) throw new Invalid(`expected a ${what} without spaces, got ${quote(s)}`);
    return t;
  };
}

function absolutePath(s: string): string {
  if (!isAbsolute(s)) throw new Invalid(`expected an absolute path, got ${quote(s)}`);
  return s;
}

function logOutput(s: string): string {
  const lower = s.toLowerCase();
  if (lower === 'stderr' || lower === 'stdout') return lower;
  if (!isAbsolute(s)) throw new Invalid(`expected stderr, stdout or an absolute file path, got ${quote(s)}`);
  return s;
}

/** A semantic version with a leading "v": v17.0.1, v17.1.0-beta.2. */
function version(s: string): string {
  const rest = s.startsWith('v') ? s.slice(1) : '';
  if (!/^\d/.test(rest) || semver.valid(rest) === null) {
    throw new Invalid(`expected a version with a leading v such as v17.0.1, got ${quote(s)}`);
  }
  return s;
}

function httpUrl(s: string): string {
  let url: URL | undefined;
  try {
    url = new URL(s);
  } catch {
    url = undefined;
  }
  if (!url || (url.protocol !== 'http:' && url.protocol !== 'https:') || url.hostname === '') {
    throw new Invalid(`expected an http:// or https:// URL, got ${quote(redactUrl(s))}`);
  }
  return s;
}

const CHANNEL_NAME = /^[A-Za-z0-9._-]+(?:\/[A-Za-z0-9._-]+)*$/;

/** Channel names appear in URL paths (…/channel/stable/v14/version): no empty, "." or ".." parts. */
function channelName(s: string): void {
  if (!CHANNEL_NAME.test(s) || s.split('/').some((part) => part === '.' || part === '..')) {
    throw new Invalid(
      `channel name ${quote(s)} may only hold letters, digits, ".", "_", "-" and "/" between non-empty parts`,
    );
  }
}

function exactlyOneSource(
  channel: { readonly static_version: string | undefined; readonly forward_url: string | undefined },
  path: string,
  ctx: Ctx,
  at: unknown,
): void {
  const both = channel.static_version !== undefined && channel.forward_url !== undefined;
  const neither = channel.static_version === undefined && channel.forward_url === undefined;
  if (both) ctx.report('GW_ERR_CONFIG_CHANNEL', path, at, 'sets both static_version and forward_url');
  if (neither) ctx.report('GW_ERR_CONFIG_CHANNEL', path, at, 'sets neither static_version nor forward_url');
}

// --- the table ---------------------------------------------------------------------------------------------------

function enabled(service: ServiceName) {
  const byDefault = DEFAULT_SERVICES.includes(service);
  return flag(
    'Run this service: yes or no.',
    new Dynamic(
      byDefault
        ? 'yes when the section is present or the file has no service section'
        : 'yes when the section is present',
      (ctx) => ctx.present.has(service) || (byDefault && !SERVICE_NAMES.some((s) => ctx.present.has(s))),
      'value',
    ),
  );
}

function service<F extends Fields, P extends Spec<unknown>>(svc: ServiceName, doc: string, publicAddr: P, fields: F) {
  return section(doc, { enabled: enabled(svc), public_addr: publicAddr, ...fields });
}

const publicAddr = (port: number, what = 'this service') =>
  addrs(`Addresses clients use to reach ${what} (host or host:port, default port ${port}).`, port);

const upgradeChannel = section(
  'One channel: exactly one of static_version and forward_url.',
  {
    static_version: str('Serve this fixed version (semver with a leading v).', { type: 'version', example: 'v17.0.1', check: version }),
    forward_url: str('Ask this upstream version server (http or https URL) instead.', {
      type: 'URL',
      example: 'https://updates.example.com/v1/webapi/automaticupgrades/channel/stable/rolling',
      check: httpUrl,
    }),
  },
  { expected: 'a mapping with static_version or forward_url', check: exactlyOneSource },
);

export const SCHEMA = section('The gateway configuration file.', {
  gateway: section('This process: node name, data directory, logging.', {
    nodename: str('Name of this node in the cluster.', {
      default: new Dynamic("the machine's host name", () => hostname() || 'localhost'),
      check: name('node name'),
    }),
    data_dir: str('Directory for the embedded backend, keys and certificates.', {
      type: 'absolute path',
      default: '/var/lib/gateway',
      check: absolutePath,
    }),
    log: section('Logging.', {
      output: str('Where log lines go: stderr, stdout or an absolute file path.', {
        type: 'stderr | stdout | path',
        default: 'stderr',
        check: logOutput,
      }),
      severity: oneOf('Lowest level that is logged.', ['trace', 'debug', 'info', 'warn', 'error'], 'info'),
      format: oneOf('json (one object per line) or text (readable).', ['json', 'text'], undefined, {
        defaultDoc: 'text on a terminal, json otherwise',
        example: 'json',
      }),
    }),
  }),

  auth_service: service('auth_service', 'Auth Service: cluster state, certificate authorities, the API.', publicAddr(3025, 'the Auth Service'), {
    cluster_name: str('Name of the cluster; cannot change once the cluster exists.', {
      default: new Dynamic('the value of `gateway.nodename`', (ctx) => String(ctx.values.get('gateway.nodename'))),
      check: name('cluster name'),
    }),
    listen_addr: listen('TLS gRPC API used by every service of the cluster.', { port: 3025, default: '0.0.0.0:3025' }),
    proxy_listener_mode: oneOf(
      'multiplex: proxies serve every protocol on the web port; separate: one listener per protocol.',
      ['multiplex', 'separate'],
      'multiplex',
    ),
  }),

  proxy_service: service('proxy_service', 'Proxy Service: the public entry point (web, tunnels, protocols).', publicAddr(443, 'the web UI and API'), {
    web_listen_addr: listen('Web UI and HTTPS API; in multiplex mode every protocol.', { port: 443, default: '0.0.0.0:443' }),
    tunnel_listen_addr: listen('Reverse tunnels from agents (separate mode).', { port: 3024, default: '0.0.0.0:3024' }),
    listen_addr: listen('SSH port clients connect to (separate mode).', { port: 3023, default: '0.0.0.0:3023' }),
    peer_listen_addr: listen('Proxy Peering: other proxies reach agents through this one.', { port: 3021, default: '0.0.0.0:3021' }),
    mysql_listen_addr: listen('MySQL clients (separate mode).', { port: 3036, default: '0.0.0.0:3036' }),
    postgres_listen_addr: listen('Postgres clients (separate mode).', { port: 5432, default: '0.0.0.0:5432' }),
    mongo_listen_addr: listen('MongoDB clients (separate mode).', { port: 27017, default: '0.0.0.0:27017' }),
    redis_listen_addr: listen('Redis clients (separate mode).', { port: 6379, default: '0.0.0.0:6379' }),
    kube_listen_addr: listen('Kubernetes clients (separate mode); no listener unless set.', { port: 3026, defaultDoc: 'none (off)' }),
    ssh_public_addr: publicAddr(3023, 'the SSH proxy'),
    tunnel_public_addr: publicAddr(3024, 'the reverse-tunnel port'),
    kube_public_addr: publicAddr(3026, 'the Kubernetes proxy'),
    postgres_public_addr: publicAddr(5432, 'the Postgres proxy'),
    mysql_public_addr: publicAddr(3036, 'the MySQL proxy'),
    mongo_public_addr: publicAddr(27017, 'the MongoDB proxy'),
    automatic_upgrades_channels: mapOf('Agent versions the version server serves, by channel name.', {
      type: 'map: channel name → channel',
      key: '<channel>',
      checkKey: channelName,
      value: upgradeChannel,
      expected: 'a mapping of channel names',
      example: {
        default: { static_version: 'v17.0.1' },
        'stable/rolling': { forward_url: 'https://updates.example.com/v1/webapi/automaticupgrades/channel/stable/rolling' },
      },
    }),
  }),

  ssh_service: service('ssh_service', 'SSH Service agent.', publicAddr(3022), {
    listen_addr: listen('Incoming SSH when the agent joins the Auth Service directly.', { port: 3022, default: '0.0.0.0:3022' }),
  }),
  // The Database and Application Services use reverse tunnels only: no listener, and public_addr has no port.
  db_service: service('db_service', 'Database Service agent.', addrs('Extra names for this service (host or host:port).'), {}),
  app_service: service('app_service', 'Application Service agent.', addrs('Extra names for this service (host or host:port).'), {}),
  kube_service: service('kube_service', 'Kubernetes Service agent.', publicAddr(3026), {
    listen_addr: listen('HTTPS to the Kubernetes API when the agent joins directly.', { port: 3026, default: '0.0.0.0:3026' }),
  }),
  windows_desktop_service: service('windows_desktop_service', 'Windows Desktop Service agent.', publicAddr(3028), {
    listen_addr: listen('Desktop protocol when the agent joins directly.', { port: 3028, default: '0.0.0.0:3028' }),
  }),
}, { expected: 'a mapping of sections (gateway:, auth_service:, proxy_service:, ...)' });

// The table and the hand-written GatewayConfig type must describe the same object.
type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
const schemaMatchesType: Equal<Infer<typeof SCHEMA>, GatewayConfig> = true;
void schemaMatchesType;
