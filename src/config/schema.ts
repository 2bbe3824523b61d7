/**
 * The configuration file, declared once: every key with its type, default, check and one-line comment.
 * parseConfig() validates against this table, sampleConfig() prints it, and a test checks docs/configuration.md
 * against it. To add a key, add a line here (and a row in the docs; the test tells you if you forget).
 */
import { hostname } from 'node:os';
import { isAbsolute } from 'node:path';
import semver from 'semver';
import { defaultDataDir, defaultWebPort, SYSTEM_DATA_DIR, UNPRIVILEGED_WEB_PORT } from '../paths.js';
import { redactUrl } from '../redact.js';
import { ConnStringError, parsePgConnString } from '../backend/pgconn.js';
import { isMap, isNode, isScalar } from 'yaml';
import { AddrError, dnsNameProblem, formatHostPort, isIpLiteral, normalizeHost, parseAddr, type HostPort, type ParsedAddr } from '../addr.js';
import { formatDuration, parseDuration } from '../duration.js';
import { defaultMaxConnections, defaultMaxConnectionsPerSource, readOpenFileLimit } from '../net/source.js';
import { MAX_TRUSTED_SOURCES, parseTrustedSource } from '../mux/trust.js';
import { parseHeaderList, TracingSettingsError } from '../trace.js';
import { DATA_POOL_DEFAULT, DATA_POOL_MAX } from '../tunnel/e2e.js';
import {
  Dynamic,
  Invalid,
  addrs,
  describeNode,
  flag,
  hostPort,
  int,
  itemSection,
  join,
  labels,
  leaf,
  listOf,
  listWithDefault,
  listen,
  mapOf,
  oneOf,
  section,
  str,
  type Ctx,
  type Fields,
  httpUrl,
  type Infer,
  type Leaf,
  type Spec,
  yamlString,
} from './spec.js';
import type { GatewayConfig, ServiceName } from './types.js';
import { UPGRADE_GROUP_PATTERN } from '../wire/autoupdate.js';
import { DATABASE_PROTOCOLS, listenerRows, type ListenAddrKey, type OptionalListenAddrKey, type PublicAddrKey } from '../wire/protocols.js';

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

/** One entry of proxy_protocol_trusted_sources, checked as the multiplexer will read it (src/mux/trust.ts). */
const trustedSource = leaf<string>({
  doc: 'A load balancer: its IP address (10.0.0.5, 2001:db8::5) or network (10.0.0.0/24, 2001:db8::/64).',
  type: 'IP address or CIDR network',
  // An item of a list has no default: the list itself reports an empty item.
  default: undefined as unknown as string,
  defaultDoc: 'required',
  render: yamlString,
  parse: (node) => {
    const text = isScalar(node) && typeof node.value === 'string' ? node.value : undefined;
    if (text === undefined) throw new Invalid(`expected an IP address or CIDR network, got ${describeNode(node)}`, 'GW_ERR_CONFIG_TYPE');
    try {
      return parseTrustedSource(text).text;
    } catch (err) {
      if (err instanceof AddrError) throw new Invalid(`expected an IP address or CIDR network, got ${quote(text)} (${err.message})`, 'GW_ERR_CONFIG_ADDR', err.hint);
      throw err;
    }
  },
});

const quote = (s: string): string => JSON.stringify(s);

function name(what: string) {
  return (s: string): string => {
    const t = s.trim();
    if (t === '' || /[\s\u0000-\u001f\u007f]/.test(t)) throw new Invalid(`expected a ${what} without spaces, got ${quote(s)}`);
    return t;
  };
}

/** A rollout group's name (src/wire/autoupdate.ts UPGRADE_GROUP_PATTERN, what the Proxy keeps from a hello). */
function upgradeGroup(s: string): string {
  if (!UPGRADE_GROUP_PATTERN.test(s)) {
    throw new Invalid(`expected a rollout group name of 1 to 32 of a-z, 0-9 and "-", got ${quote(s)}`, 'GW_ERR_CONFIG_VALUE', 'Name the group as the autoupdate_config lists it (lowercase letters, digits and "-", at most 32), such as prod or dev-eu.');
  }
  return s;
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

/** A duration such as 500ms, 5s, 2m; stored in milliseconds. */
function duration(doc: string, def: string) {
  const toMs = (text: string): number => {
    let ms = 0;
    try {
      ms = parseDuration(text);
    } catch {
      ms = 0;
    }
    if (ms <= 0) throw new Invalid(`expected a duration such as 500ms, 5s or 2m, got ${quote(text)}`);
    return ms;
  };
  return leaf<number>({
    doc,
    type: 'duration',
    default: toMs(def),
    defaultDoc: def,
    render: (v) => (v % 1000 === 0 ? formatDuration(v) : `${v}ms`),
    parse: (node) => {
      if (!isScalar(node) || typeof node.value !== 'string') throw new Invalid(`expected a duration such as 5s, got ${describeNode(node)}`, 'GW_ERR_CONFIG_TYPE');
      return toMs(node.value);
    },
  });
}


/** Names of an agent's resources (databases, apps, desktops, clusters): they end up in host names and commands. */
const RESOURCE_NAME = /^[a-z][a-z0-9-]{0,62}$/;

function resourceName(s: string): string {
  if (!RESOURCE_NAME.test(s)) {
    const hint = /^[A-Za-z][A-Za-z0-9-]{0,62}$/.test(s) ? `Write it in lowercase: ${s.toLowerCase()}` : undefined;
    throw new Invalid(`expected a name of 1 to 63 lowercase letters, digits and "-" that starts with a letter, got ${quote(s)}`, 'GW_ERR_CONFIG_VALUE', hint);
  }
  return s;
}

type UriScheme = 'http' | 'https' | 'tcp';
const DEFAULT_PORTS: Readonly<Record<UriScheme, number | undefined>> = { http: 80, https: 443, tcp: undefined };

/**
 * scheme://host[:port][/path] for the given schemes, normalised: scheme and DNS name in lowercase, no trailing
 * dot, IPv6 in brackets, the scheme's default port and a lone "/" path dropped. tcp:// takes a port and no path.
 * User names, passwords, queries and fragments are refused.
 */
function uri(schemes: readonly UriScheme[], what: string, hint: string) {
  return (s: string): string => {
    const shown = quote(redactUrl(s));
    const m = /^([A-Za-z][A-Za-z0-9+.-]*):\/\/([^/?#]*)(.*)$/s.exec(s.trim());
    const scheme = m?.[1]?.toLowerCase() as UriScheme | undefined;
    if (!m || scheme === undefined || !schemes.includes(scheme)) throw new Invalid(`expected ${what}, got ${shown}`, 'GW_ERR_CONFIG_VALUE', hint);
    const authority = m[2]!;
    const rest = m[3]!;
    if (authority.includes('@')) throw new Invalid(`expected ${what} without a user name or password, got ${shown}`, 'GW_ERR_CONFIG_VALUE', hint);
    let addr: ParsedAddr;
    try {
      addr = parseAddr(authority);
    } catch (err) {
      if (err instanceof AddrError) throw new Invalid(`expected ${what}, got ${shown} (${err.message})`, 'GW_ERR_CONFIG_ADDR', err.hint ?? hint);
      throw err;
    }
    if (scheme === 'tcp' && addr.port === undefined) throw new Invalid(`expected tcp://host:port, got ${shown} (the port is required)`, 'GW_ERR_CONFIG_ADDR', hint);
    if (/[?#]/.test(rest)) throw new Invalid(`expected ${what} without a query or fragment, got ${shown}`, 'GW_ERR_CONFIG_VALUE', hint);
    if (/[\s\u0000-\u001f\u007f]/.test(rest)) throw new Invalid(`expected ${what} without spaces, got ${shown}`, 'GW_ERR_CONFIG_VALUE', hint);
    if (scheme === 'tcp' && rest !== '' && rest !== '/') throw new Invalid(`expected tcp://host:port without a path, got ${shown}`, 'GW_ERR_CONFIG_VALUE', hint);
    const path = rest === '/' ? '' : rest;
    const port = addr.port === DEFAULT_PORTS[scheme] ? undefined : addr.port;
    const host = port !== undefined ? formatHostPort(addr.host, port) : isIpLiteral(addr.host) && addr.host.includes(':') ? `[${addr.host}]` : addr.host;
    return `${scheme}://${host}${path}`;
  };
}

const appUri = uri(
  ['http', 'https', 'tcp'],
  'an http://, https:// or tcp:// URI',
  'Write http://host:port[/path] or https://host:port[/path] for a web app, tcp://host:port for a TCP app.',
);
const kubeApiServer = uri(['https'], 'an https:// URL', 'The Kubernetes API is reached over TLS only: write https://host[:port][/path].');

/** A DNS name without a port: an HTTP app's name on the Proxy's web port. Stored in lowercase without a trailing dot. */
function dnsName(s: string): string {
  const t = s.trim();
  const hint = 'Write a DNS name only, such as grafana.gateway.example.com: the Proxy serves the app on its web port.';
  if (isIpLiteral(normalizeHost(t))) throw new Invalid(`expected a DNS name, got the IP address ${quote(s)}`, 'GW_ERR_CONFIG_ADDR', hint);
  if (t.includes(':')) throw new Invalid(`expected a DNS name without a port, got ${quote(s)}`, 'GW_ERR_CONFIG_ADDR', hint);
  const problem = dnsNameProblem(t.endsWith('.') ? t.slice(0, -1) : t);
  if (problem) throw new Invalid(`expected a DNS name, got ${quote(s)} (${problem.message})`, 'GW_ERR_CONFIG_ADDR', problem.hint ?? hint);
  return normalizeHost(t);
}

/** public_addr is for apps the Proxy serves over HTTP(S). */
function httpAppOnly(app: { readonly uri: string; readonly public_addr: string | undefined }, path: string, ctx: Ctx, at: unknown): void {
  if (app.public_addr === undefined || !app.uri.startsWith('tcp://')) return;
  const node = isMap(at) ? at.get('public_addr', true) : undefined;
  ctx.report(
    'GW_ERR_CONFIG_VALUE',
    join(path, 'public_addr'),
    isNode(node) ? node : at,
    'public_addr is for http:// and https:// apps, which the Proxy serves on its web port; this app is tcp://',
    'Remove public_addr from this app.',
  );
}

/** credentials: kubeconfig needs the file named; a kubeconfig named under other credentials would be ignored. */
function kubeconfigNamed(cluster: { readonly credentials: string; readonly kubeconfig: string | undefined }, path: string, ctx: Ctx, at: unknown): void {
  if (cluster.credentials === 'kubeconfig' && cluster.kubeconfig === undefined) {
    ctx.report('GW_ERR_CONFIG_VALUE', path, at, 'credentials: kubeconfig names no kubeconfig file', 'Add kubeconfig: /path/to/kubeconfig to this cluster.');
  }
  if (cluster.credentials !== 'kubeconfig' && cluster.kubeconfig !== undefined) {
    ctx.report('GW_ERR_CONFIG_VALUE', join(path, 'kubeconfig'), at, `kubeconfig is set but credentials is ${cluster.credentials}, so it would be ignored`, 'Add credentials: kubeconfig to this cluster, or remove kubeconfig.');
  }
}

const resourceLabels = () => labels('Labels of this resource, matched by the roles that grant access to it.');

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

/** A postgresql:// connection string the backend can use (src/backend/pgconn.ts); kept as written. */
/** A share from 0 to 1 (a sampling ratio); unset: undefined, for the caller's fallback. */
function ratio(doc: string, defaultDoc: string): Leaf<number | undefined> {
  return leaf<number | undefined>({
    doc,
    type: 'number 0..1',
    default: undefined,
    defaultDoc,
    example: '0.1',
    render: (v) => (v === undefined ? '' : String(v)),
    parse: (node) => {
      if (!isScalar(node) || typeof node.value !== 'number') {
        const quoted = isScalar(node) && typeof node.value === 'string' && Number.isFinite(Number(node.value));
        throw new Invalid(`expected a number from 0 to 1, got ${describeNode(node)}`, 'GW_ERR_CONFIG_TYPE', quoted ? 'Write the number without quotes.' : undefined);
      }
      if (!Number.isFinite(node.value) || node.value < 0 || node.value > 1) {
        throw new Invalid(`expected a number from 0 to 1, got ${describeNode(node)}`, 'GW_ERR_CONFIG_VALUE', 'Write a share such as 0.1 (one trace in ten) or 1 (every trace).');
      }
      return node.value;
    },
  });
}

/** OTLP headers as OTEL_EXPORTER_OTLP_HEADERS writes them; checked here so that a bad list fails at start. */
function otlpHeaders(s: string): string {
  try {
    parseHeaderList(s);
  } catch (err) {
    if (err instanceof TracingSettingsError) throw new Invalid(err.message, 'GW_ERR_CONFIG_VALUE', 'Write key=value pairs separated by commas, values percent-encoded: "x-api-key=abc,x-team=ops".');
    throw err;
  }
  return s;
}

function pgConnString(s: string): string {
  try {
    parsePgConnString(s);
  } catch (err) {
    if (err instanceof ConnStringError) throw new Invalid(err.message, 'GW_ERR_CONFIG_VALUE', err.hint);
    throw err;
  }
  return s;
}

/** postgres needs conn_string; the PostgreSQL keys mean nothing to sqlite; a client certificate comes with its key. */
function storageRules(
  storage: { readonly type: 'sqlite' | 'postgres'; readonly conn_string: string | undefined; readonly cert_file: string | undefined; readonly key_file: string | undefined; readonly ca_file: string | undefined },
  path: string,
  ctx: Ctx,
  at: unknown,
): void {
  if (storage.type === 'postgres' && storage.conn_string === undefined) {
    ctx.report('GW_ERR_CONFIG_VALUE', join(path, 'conn_string'), at, 'type postgres needs conn_string', 'Add conn_string: postgresql://user@host:5432/database');
  }
  if (storage.type === 'sqlite') {
    for (const key of ['conn_string', 'ca_file', 'cert_file', 'key_file'] as const) {
      if (storage[key] !== undefined) {
        ctx.report('GW_ERR_CONFIG_VALUE', join(path, key), at, `${key} is for type postgres; this storage is sqlite`, 'Set type: postgres, or remove the key.');
      }
    }
  }
  if ((storage.cert_file === undefined) !== (storage.key_file === undefined)) {
    const missing = storage.cert_file === undefined ? 'cert_file' : 'key_file';
    ctx.report('GW_ERR_CONFIG_VALUE', join(path, missing), at, `a client certificate needs both cert_file and key_file; ${missing} is missing`, 'Set cert_file and key_file together.');
  }
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

/**
 * Each protocol's listen and public address in proxy_service, from the wire's table (src/wire/protocols.ts), in
 * its order: a row with a listener gets <key> (default 0.0.0.0:<port>, or none when off; the web's depends on the
 * user), and with a public address <publicAddr.key> (default port: the listener's).
 */
function protocolAddrFields() {
  type Listens = { [K in ListenAddrKey]: Leaf<HostPort> } & { [K in OptionalListenAddrKey]: Leaf<HostPort | undefined> };
  const listens: Record<string, Leaf<HostPort | undefined>> = {};
  const publics: Record<string, Leaf<readonly HostPort[]>> = {};
  for (const { name, listener: l, publicAddr: pub } of listenerRows()) {
    if (l.off) listens[l.key] = listen(l.doc, { port: l.port, defaultDoc: 'none (off)' });
    else if (name === 'web') listens[l.key] = listen(l.doc, { port: l.port, default: new Dynamic(`0.0.0.0:443 for root; 0.0.0.0:${UNPRIVILEGED_WEB_PORT} for other users`, () => `0.0.0.0:${defaultWebPort()}`) });
    else listens[l.key] = listen(l.doc, { port: l.port, default: `0.0.0.0:${l.port}` });
    if (pub) publics[pub.key] = publicAddr(l.port, pub.what);
  }
  return { listen: listens as Listens, public: publics as { [K in PublicAddrKey]: Leaf<readonly HostPort[]> } };
}
const PROTOCOL_ADDRS = protocolAddrFields();

const artifactUpstream = uri(['http', 'https'], 'an http:// or https:// URL', 'Write https://host[:port][/path] of the download site or repository, without a user name, password or query.');

/** Release artifacts relayed and cached by the Proxy for agents that reach only it (docs/upgrades.md, "Artifacts through the Proxy"). */
const autoupdateArtifacts = section("Release artifacts through this Proxy: agents that reach only the Proxy fetch the release tarballs and the package repository from it; the Proxy fetches them through its HTTPS_PROXY and caches them. The agents still check every signature and checksum themselves.", {
  download_url: str('Where release tarballs and their .sha256 files are (the agents\' GATEWAY_UPGRADE_DOWNLOAD_URL otherwise); served at /v1/webapi/autoupdate/artifacts/<name>.', {
    type: 'URL',
    defaultDoc: 'none: the tarball route answers GW_ERR_ARTIFACT_DISABLED',
    example: 'https://cdn.gateway.example',
    check: artifactUpstream,
  }),
  repo_url: str('The package repository (apt and rpm layouts below it); served at /v1/webapi/autoupdate/repo/<path>.', {
    type: 'URL',
    defaultDoc: 'none: the repository route answers GW_ERR_ARTIFACT_DISABLED',
    example: 'https://apt.gateway.example',
    check: artifactUpstream,
  }),
  cache_dir: str('Where fetched artifacts are kept.', { type: 'absolute path', defaultDoc: '<data_dir>/artifacts', check: absolutePath }),
  cache_max_bytes: int('The most bytes the cache holds; beyond it the least recently used files go (a file larger than this is relayed, not kept).', {
    min: 1024 * 1024,
    max: 2 ** 50,
    default: 8 * 1024 ** 3,
  }),
  fetch_timeout: duration('How long the upstream may take to answer, and to send the next bytes of a file, before the fetch fails.', '30s'),
  fetch_deadline: duration('The longest one fetch may take in all, however steadily the upstream trickles bytes.', '1h'),
  index_ttl: duration('How long a repository index (InRelease, Packages, repomd.xml ...) is served from the cache before it is fetched again; packages, tarballs and by-hash files are kept by name.', '60s'),
  max_fetches: int('How many different files may be fetched from the upstream at once; requests for a file already being fetched share that fetch.', { min: 1, max: 256, default: 16 }),
});

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
      default: new Dynamic(`${SYSTEM_DATA_DIR} for root; $XDG_STATE_HOME/gateway (~/.local/state/gateway) for other users`, () => defaultDataDir()),
      check: absolutePath,
    }),
    upgrade_group: str("An agent's rollout group (docs/upgrades.md, \"Managed rollouts\"), sent to the Proxy in its tunnel's hello: 1 to 32 of a-z, 0-9 and \"-\".", {
      type: 'group name',
      defaultDoc: 'the `upgrade-group` label of ssh_service.labels, else none (the rollout\'s catch-all group)',
      example: 'prod',
      check: upgradeGroup,
    }),
    upgrade_stale_after: duration("An agent's upgrader counts as stale when its last run (/etc/gateway-upgrade.d/last-run) is older than this, or there is none this long after start: the agent then says so in a warning, gateway_agent_upgrade_stale and its health's upgrader check.", '24h'),
    auth_server: addrs("Auth API address(es) (host or host:port, default port 3025) of a Proxy that runs without the Auth Service in its process; the Proxy fails over to the next one. --auth-server overrides it.", 3025),
    proxy_ca_file: str("PEM file with the root CA of a TLS-inspecting proxy on the way out (your organisation's): behind it, the cluster's TLS goes inside a WebSocket upgrade on the Proxy's web address, end to end (docs/dialing.md). Added to GATEWAY_PROXY_CA_FILE and NODE_EXTRA_CA_CERTS.", {
      type: 'absolute path',
      defaultDoc: 'none: only GATEWAY_PROXY_CA_FILE and NODE_EXTRA_CA_CERTS',
      example: '/etc/gateway/corp-root.pem',
      check: absolutePath,
    }),
    diag_addr: listen("Health endpoints for a supervisor (Kubernetes probes), also --diag-addr: GET /healthz answers 200 while the process runs, GET /readyz 200 when every check of its roles passed (backend, Auth Service, listeners; an agent: its tunnel and resources), else 503, naming each check; GET /metrics the process's metrics in Prometheus's format (docs/operations.md). Plain HTTP, no credentials: bind it to an address only the supervisor and the scraper reach, never a public listener's.", { port: 3000, defaultDoc: 'none (off)' }),
    drain_limit: duration("Agents: how long the SSH, database, app and Kubernetes sessions in flight may go on in a process that is handing over to its successor (SIGUSR2, which gateway-upgrade's restart sends), or stopping on SIGTERM when drain_on_stop is yes; once reached, what is left is closed with GW_ERR_DRAIN_LIMIT. A second SIGTERM stops at once (docs/upgrades.md, \"Restarts that keep sessions\").", '30m'),
    e2e_pool: int(`Agents: how many idle data connections each v2 tunnel keeps to its Proxy for end-to-end streams (docs/tunnels.md, "End-to-end streams: the agent"), dialled like the tunnel (through HTTPS_PROXY); 0 turns end-to-end streams off for this agent (the Proxy then routes its streams the classic way). At most ${DATA_POOL_MAX}, what a Proxy keeps per tunnel.`, { min: 0, max: DATA_POOL_MAX, default: DATA_POOL_DEFAULT }),
    drain_on_stop: flag("Agents: SIGTERM drains the sessions in flight (up to drain_limit) before stopping, instead of stopping at once. The Kubernetes chart sets it for a Deployment, whose new pod serves before the old one gets SIGTERM; on a systemd host an upgrade hands over with SIGUSR2 and needs none, so `systemctl stop` stays quick.", false),
    tracing: section('Traces over OTLP/HTTP (docs/operations.md, "Tracing"): off unless an endpoint is set here or in OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; OTEL_TRACES_EXPORTER=none turns it off.', {
      otlp_endpoint: str('The OTLP/HTTP traces URL of the collector (JSON is sent), as OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: the whole URL, path included.', {
        type: 'URL',
        defaultDoc: 'none: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces, else off',
        example: 'http://otel-collector.internal:4318/v1/traces',
        check: httpUrl,
      }),
      sample_ratio: ratio("The share of traces recorded, decided on the trace id; a trace a client started is sampled by this ratio too (its sampled flag is not trusted); a Proxy's decision is followed by the peer Proxy and the agent.", 'OTEL_TRACES_SAMPLER_ARG, else 1'),
      headers: str('Headers sent with every export, as OTEL_EXPORTER_OTLP_HEADERS: key=value pairs separated by commas, values percent-encoded. Never logged.', {
        type: 'key=value,...',
        defaultDoc: 'OTEL_EXPORTER_OTLP_TRACES_HEADERS, else OTEL_EXPORTER_OTLP_HEADERS, else none',
        example: 'x-api-key=abc123',
        check: otlpHeaders,
      }),
    }),
    storage: section('Where the Auth Service keeps the cluster state (docs/backend.md).', {
      type: oneOf('sqlite: embedded, in <data_dir>/backend.sqlite; postgres: a PostgreSQL database that several Auth Services share.', ['sqlite', 'postgres'], 'sqlite'),
      conn_string: str('PostgreSQL connection string, postgres only: postgresql://user[:password]@host[:port]/database, parameters sslmode, host (socket directory), application_name, connect_timeout.', {
        type: 'postgresql:// URL',
        defaultDoc: 'required for postgres',
        example: 'postgresql://gateway@db.internal:5432/gateway?sslmode=verify-full',
        check: pgConnString,
      }),
      ca_file: str("PEM file of the CA that signs the PostgreSQL server's certificate; TLS is then verified (sslmode verify-full unless the connection string says otherwise).", {
        type: 'absolute path',
        defaultDoc: "none: TLS as sslmode says, verified against the system's CAs",
        example: '/etc/gateway/postgres-ca.pem',
        check: absolutePath,
      }),
      cert_file: str('PEM client certificate for PostgreSQL "cert" authentication (its CN is the database user); with key_file.', {
        type: 'absolute path',
        defaultDoc: 'none: password authentication',
        example: '/etc/gateway/postgres-client.pem',
        check: absolutePath,
      }),
      key_file: str('PEM private key of cert_file.', { type: 'absolute path', defaultDoc: 'none', example: '/etc/gateway/postgres-client-key.pem', check: absolutePath }),
    }, { expected: 'a mapping with type, conn_string, ca_file, cert_file and key_file', check: storageRules }),
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
    limits: section('Deadlines and connection caps of every listener of this process: the web port, the Auth API, the SSH and tunnel ports (docs/security.md).', {
      tls_handshake_timeout: duration('How long a TLS handshake may take, from the first byte of the ClientHello to the end of the handshake.', '10s'),
      header_timeout: duration("How long an HTTP request's head may take to arrive (after the handshake, or after the previous answer), and the route header of a database, TCP or SSH connection.", '20s'),
      request_timeout: duration("How long an HTTP request's body may take to arrive once its head has; raise it for large uploads to HTTP apps.", '2m'),
      idle_timeout: duration('HTTP: how long a request or answer may move no bytes. SSH: how long an authenticated connection may stay with no channel open.', '5m'),
      ssh_handshake_timeout: duration('How long an SSH client may take from connecting to being authenticated (version, key exchange, authentication).', '30s'),
      half_close_linger: duration('Once either side of a connection has closed its sending direction, how long it may stay open with no bytes moving.', '30s'),
      max_connections: int('Open connections each listener accepts; more are closed at once.', {
        min: 1,
        max: 10_000_000,
        default: new Dynamic('10000, or a quarter of the open-file limit above 128 when that is less', () => defaultMaxConnections(readOpenFileLimit())),
      }),
      max_connections_per_source: int('Open connections one client address (IPv6: one /64) may hold on each listener.', {
        min: 1,
        max: 10_000_000,
        default: new Dynamic('1000, or a quarter of `max_connections` when that is less', (ctx) =>
          defaultMaxConnectionsPerSource(Number(ctx.values.get('gateway.limits.max_connections')))),
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
    keep_alive_interval: duration(
      'How often agents and proxies send heartbeats over a reverse tunnel. 15 s keeps three heartbeats inside the 60 s idle timeout that load balancers commonly use, and with keep_alive_count_max 3 each end finds a dead tunnel within 48.75 s (docs/tunnels.md).',
      '15s',
    ),
    keep_alive_count_max: int('Heartbeats missed in a row before the Proxy marks an agent offline and drops its tunnel.', { min: 1, max: 100, default: 3 }),
    tunnel_strategy: section('How agents keep reverse tunnels when several Proxies run (docs/high-availability.md).', {
      type: oneOf(
        'agent_mesh: every agent keeps a tunnel to every Proxy; proxy_peering: agents keep agent_connection_count tunnels and Proxies carry clients to each other on peer_listen_addr.',
        ['agent_mesh', 'proxy_peering'],
        'agent_mesh',
      ),
      agent_connection_count: int('proxy_peering: how many Proxies each agent keeps a tunnel to.', { min: 1, max: 64, default: 1 }),
    }),
    authentication: section('How users sign in: what /webapi/ping and the login page offer first (docs/sso.md).', {
      type: oneOf(
        'local: user name and password; oidc, saml, github: the connector connector_name of that kind (local users can still sign in).',
        ['local', 'oidc', 'saml', 'github'],
        'local',
      ),
      connector_name: str('The connector offered by default (oidc, saml, github); empty: the first of that kind.', { default: '' }),
    }),
    autoupdate_interval: duration('How often the managed rollout is stepped (besides after every change of its resources or of the agents\' presence): docs/upgrades.md, "Managed rollouts".', '15s'),
  }),

  proxy_service: service('proxy_service', 'Proxy Service: the public entry point (web, tunnels, protocols).', publicAddr(443, 'the web UI and API'), {
    ...PROTOCOL_ADDRS.listen,
    peer_listen_addr: listen('Proxy Peering: other proxies reach agents through this one.', { port: 3021, default: '0.0.0.0:3021' }),
    ...PROTOCOL_ADDRS.public,
    peer_public_addr: addrs('Address other Proxies reach this one at for peering (host or host:port, default port 3021); else this node with the peering port.', 3021),
    proxy_protocol: oneOf(
      'on: accept one PROXY protocol header (v1 or v2) per connection from a load balancer, and use its client address; off: refuse such headers. A header is believed only from the sources in `proxy_protocol_trusted_sources` when that lists any.',
      ['on', 'off'],
      'off',
    ),
    proxy_protocol_trusted_sources: listWithDefault(
      'With proxy_protocol on: the load balancers a PROXY header is believed from (IP addresses and CIDR networks, matched against the connection\'s own peer); a header from any other source closes the connection. Empty: any source (warned at start).',
      trustedSource,
      { type: 'list of IP addresses or CIDR networks', expected: 'a list of IP addresses or CIDR networks', max: MAX_TRUSTED_SOURCES, unique: (s) => s },
    ),
    detect_timeout: duration('How long a new connection may take to show what protocol it speaks (and, for TLS, send its ClientHello).', '5s'),
    https_keypairs: listWithDefault(
      "Certificates for the web port instead of the one the cluster's host CA issues (e.g. from a public CA).",
      itemSection('One certificate and its key.', {
        cert_file: str('PEM certificate chain file.', { type: 'absolute path', check: absolutePath, defaultDoc: 'required' }),
        key_file: str('PEM private key file.', { type: 'absolute path', check: absolutePath, defaultDoc: 'required' }),
      }, { required: ['cert_file', 'key_file'], expected: 'a mapping with cert_file and key_file' }),
      {
        type: 'list of {cert_file, key_file}',
        expected: 'a list of {cert_file, key_file} mappings',
        exampleItem: { cert_file: '/etc/gateway/tls/fullchain.pem', key_file: '/etc/gateway/tls/privkey.pem' },
      },
    ),
    autoupdate_artifacts: autoupdateArtifacts,
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
    listen_addr: listen('Agents joined to the Auth Service directly (no tunnel): where the Proxy reaches the SSH Service (mutual TLS, Proxies of the cluster only, then SSH).', { port: 3022, default: '0.0.0.0:3022' }),
    labels: labels('Labels of this node, which the SSH Service advertises; roles select nodes by them.'),
    sftp_server: str("Serve the sftp subsystem with this program (e.g. OpenSSH's) instead of the built-in server.", {
      type: 'absolute path',
      defaultDoc: 'none: the built-in sftp-server',
      example: '/usr/lib/openssh/sftp-server',
      check: absolutePath,
    }),
  }),
  // The Database and Application Services use reverse tunnels only: no listener, and public_addr has no port.
  db_service: service('db_service', 'Database Service agent.', addrs('Extra names for this service (host or host:port).'), {
    databases: listWithDefault(
      'Databases this agent proxies.',
      itemSection('One database.', {
        name: str('Name of the database in the cluster: 1 to 63 of a-z, 0-9 and "-", starting with a letter; unique in the list.', {
          type: 'name',
          defaultDoc: 'required',
          check: resourceName,
        }),
        protocol: oneOf('Protocol the database speaks.', DATABASE_PROTOCOLS, undefined, { defaultDoc: 'required', example: 'postgres' }),
        uri: hostPort('Address of the database server, with its port.', { example: 'postgres.internal:5432', defaultDoc: 'required' }),
        labels: resourceLabels(),
      }, { required: ['name', 'protocol', 'uri'], expected: 'a mapping with name, protocol, uri and labels' }),
      {
        type: 'list of {name, protocol, uri, labels}',
        expected: 'a list of {name, protocol, uri, labels} mappings',
        unique: (db) => db.name,
        exampleItem: { name: 'main', protocol: 'postgres', uri: 'postgres.internal:5432', labels: '{env: prod}' },
      },
    ),
  }),
  app_service: service('app_service', 'Application Service agent.', addrs('Extra names for this service (host or host:port).'), {
    apps: listWithDefault(
      'Applications this agent proxies.',
      itemSection('One application.', {
        name: str('Name of the app in the cluster: 1 to 63 of a-z, 0-9 and "-", starting with a letter; unique in the list.', {
          type: 'name',
          defaultDoc: 'required',
          check: resourceName,
        }),
        uri: str('Where the app listens: http://host:port[/path], https://host:port[/path] or tcp://host:port.', {
          type: 'URI',
          defaultDoc: 'required',
          example: 'http://localhost:3000',
          check: appUri,
        }),
        public_addr: str("DNS name under which the Proxy's web port serves this HTTP app, e.g. grafana.gateway.example.com.", {
          type: 'DNS name',
          example: 'grafana.gateway.example.com',
          check: dnsName,
        }),
        labels: resourceLabels(),
      }, { required: ['name', 'uri'], expected: 'a mapping with name, uri, public_addr and labels', check: httpAppOnly }),
      {
        type: 'list of {name, uri, public_addr, labels}',
        expected: 'a list of {name, uri, public_addr, labels} mappings',
        unique: (app) => app.name,
        exampleItem: { name: 'grafana', uri: 'http://localhost:3000', public_addr: 'grafana.gateway.example.com', labels: '{env: prod}' },
      },
    ),
  }),
  kube_service: service('kube_service', 'Kubernetes Service agent.', publicAddr(3026), {
    listen_addr: listen('Agents joined to the Auth Service directly (no tunnel): the Proxy dials it with mutual TLS (host certificates) to reach the Kubernetes clusters.', { port: 3026, default: '0.0.0.0:3026' }),
    clusters: listWithDefault(
      'Kubernetes clusters this agent proxies.',
      itemSection('One Kubernetes cluster.', {
        name: str('Name of the cluster in the gateway: 1 to 63 of a-z, 0-9 and "-", starting with a letter; unique in the list.', {
          type: 'name',
          defaultDoc: 'required',
          check: resourceName,
        }),
        api_server: str("URL of the cluster's API server (https:// only).", {
          type: 'https:// URL',
          defaultDoc: 'required',
          example: 'https://kube.internal:6443',
          check: kubeApiServer,
        }),
        ca_file: str("PEM file with the CA that signs the API server's certificate.", {
          type: 'absolute path',
          defaultDoc: "none: the system's trusted CAs",
          example: '/etc/gateway/kube-ca.pem',
          check: absolutePath,
        }),
        credentials: oneOf(
          "How the agent authenticates to the API server. in_cluster: the pod's service-account token (re-read when the kubelet rotates it) and CA from service_account_dir; kubeconfig: the token or client certificate (and CA) of a context in the kubeconfig file; none: no credential (an API server that checks none, such as a test's).",
          ['none', 'in_cluster', 'kubeconfig'],
          'none',
        ),
        service_account_dir: str('Directory holding the projected service-account token, ca.crt and namespace (credentials: in_cluster).', {
          type: 'absolute path',
          default: '/var/run/secrets/kubernetes.io/serviceaccount',
          check: absolutePath,
        }),
        kubeconfig: str('Kubeconfig file with the credentials (credentials: kubeconfig). exec plugins and auth-provider entries are refused.', {
          type: 'absolute path',
          defaultDoc: 'required with credentials: kubeconfig',
          example: '/etc/gateway/kubeconfig',
          check: absolutePath,
        }),
        kubeconfig_context: str("Context of the kubeconfig whose user's credentials are used.", {
          type: 'string',
          defaultDoc: "the kubeconfig's current-context",
        }),
        labels: resourceLabels(),
      }, { required: ['name', 'api_server'], expected: 'a mapping with name, api_server, ca_file, credentials and labels', check: kubeconfigNamed }),
      {
        type: 'list of {name, api_server, ca_file, labels}',
        expected: 'a list of {name, api_server, ca_file, labels} mappings',
        unique: (cluster) => cluster.name,
        exampleItem: { name: 'prod', api_server: 'https://kube.internal:6443', ca_file: '/etc/gateway/kube-ca.pem', labels: '{env: prod}' },
      },
    ),
  }),
  windows_desktop_service: service('windows_desktop_service', 'Windows Desktop Service agent.', publicAddr(3028), {
    listen_addr: listen('Agents joined to the Auth Service directly (no tunnel): the Proxy dials it with mutual TLS (host certificates) to reach the desktops.', { port: 3028, default: '0.0.0.0:3028' }),
    desktops: listWithDefault(
      'Windows desktops this agent proxies.',
      itemSection('One desktop.', {
        name: str('Name of the desktop in the cluster: 1 to 63 of a-z, 0-9 and "-", starting with a letter; unique in the list.', {
          type: 'name',
          defaultDoc: 'required',
          check: resourceName,
        }),
        addr: hostPort('Address of the desktop (default port 3389).', { port: 3389, example: '10.0.0.20', defaultDoc: 'required' }),
        labels: resourceLabels(),
      }, { required: ['name', 'addr'], expected: 'a mapping with name, addr and labels' }),
      {
        type: 'list of {name, addr, labels}',
        expected: 'a list of {name, addr, labels} mappings',
        unique: (desktop) => desktop.name,
        exampleItem: { name: 'build-win', addr: '10.0.0.20', labels: '{env: dev}' },
      },
    ),
  }),
}, { expected: 'a mapping of sections (gateway:, auth_service:, proxy_service:, ...)' });

// The table and the hand-written GatewayConfig type must describe the same object.
type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
const schemaMatchesType: Equal<Infer<typeof SCHEMA>, GatewayConfig> = true;
void schemaMatchesType;
