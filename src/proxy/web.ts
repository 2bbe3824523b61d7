/**
 * The Proxy's routes for the Web UI (docs/proxy.md, "The web routes"), served on the web port before the Auth
 * API router. Every one needs the web session: the cookie `__Host-gw_session` and, for the same session, the
 * bearer the page keeps in memory (`Authorization: Bearer`, or `bearer.<token>` among the WebSocket
 * subprotocols, since a browser cannot set headers on a WebSocket). The session is resolved through ProxyAuth
 * (resolveWebSession: the user as it stands now: removed, locked or without the role: refused as a certificate
 * would be), then the user's roles decide, with the same checks as the certificate routes:
 *
 *   GET  /webapi/resources          what the user's roles reach, with labels (access.ts's canAccess)
 *   GET  /webapi/agents             every agent: version against its channel's target, online, next window
 *   GET  /webapi/autoupdate/status  the managed rollout (RolloutStatus, src/wire/autoupdate.ts) for a user whose
 *                                   roles may read autoupdate_agent_rollout; asked of the Auth Service with the
 *                                   user's identity (rolloutStatus); {managed: false} where none is wired
 *   POST /webapi/apps/:name/launch  {state, addr?}: a one-use launch URL on the app's own host, its token bound
 *                                   to state, the nonce that host set in this browser (webapps.ts redeems it)
 *   GET  /webapi/terminal           WebSocket: a shell on a node (terminal.ts)
 *
 * A state-changing request (and every WebSocket) whose Origin is present and is not the page's own is refused
 * (GW_ERR_WEB_CSRF); no CORS header is ever sent.
 */
import type http from 'node:http';
import type { Duplex } from 'node:stream';
import semver from 'semver';
import type { Identity } from '../auth/pki.js';
import type { ProxyAuth } from '../auth/proxyauth.js';
import { canAccess, checkAccess, type Role } from '../auth/rbac.js';
import type { Resource } from '../auth/resources/index.js';
import { GatewayError, toGatewayError } from '../errors.js';
import { logger } from '../log.js';
import type { LimitSettings } from '../net/deadlines.js';
import type { AgentPresence } from '../auth/records.js';
import { bearerOf, isLaunchNonce, launchUnbound, type WebSessionView } from '../auth/websessions.js';
import { readBoundedBody } from '../net/http.js';
import type { AgentSource } from './router.js';
import { TerminalServer } from './terminal.js';
import type { RolloutStatus } from '../wire/autoupdate.js';
import { sendJson, sendWebError } from './webanswer.js';
import { appSessionKey, checkOrigin, credentialsOf, type WebCredentials } from './webcredentials.js';

export interface WebRoutesOptions {
  auth: ProxyAuth;
  agents: AgentSource;
  /** Every agent of the cluster with its presence (cluster.ts), for /webapi/agents. */
  presence: () => AgentPresence[];
  /** The target version of an upgrade channel (the version server: versions.ts). */
  targetVersion: (channel: string) => Promise<string>;
  /** The window open now, else the next one, of a cluster_maintenance_config (src/upgrade/windows.ts). */
  nextWindow: (config: Resource, now: Date) => { start: Date; end: Date } | undefined;
  limits: LimitSettings;
  clock?: () => number;
  /**
   * The managed rollout as the Auth Service tells this user (GET /v1/autoupdate/status, the user's identity: it
   * checks the roles again). Absent: this Proxy has no rollout to ask about, and the page shows the channels.
   */
  rolloutStatus?: (identity: Identity) => Promise<RolloutStatus>;
}

export interface WebRoutes {
  /** Answers the request when it is one of the routes above; false otherwise. */
  handle(req: http.IncomingMessage, res: http.ServerResponse): boolean;
  /** Takes an upgrade request when it is the terminal's; false otherwise (the connection-upgrade route's). */
  upgrade(req: http.IncomingMessage, socket: Duplex, head: Buffer): boolean;
  close(): void;
}

const LAUNCH = /^\/webapi\/apps\/([A-Za-z0-9][A-Za-z0-9._-]{0,127})\/launch$/;

export function createWebRoutes(options: WebRoutesOptions): WebRoutes {
  const log = logger('web');
  const maintenance = new MaintenanceCache(options.auth);
  const terminals = new TerminalServer({ auth: options.auth, agents: options.agents, limits: options.limits, ...(options.clock ? { clock: options.clock } : {}) });
  const routes: Record<string, { method: string; run: (req: http.IncomingMessage, session: WebSessionView, creds: WebCredentials) => Promise<unknown> }> = {
    '/webapi/resources': { method: 'GET', run: async (_req, session) => resourcesOf(options, session.identity) },
    '/webapi/agents': { method: 'GET', run: async (_req, session) => agentsOf(options, maintenance, session.identity) },
    '/webapi/autoupdate/status': { method: 'GET', run: async (_req, session) => rolloutOf(options, session.identity) },
  };
  return {
    handle(req, res) {
      const path = (req.url ?? '/').split('?')[0]!;
      const launch = LAUNCH.exec(path);
      const route = routes[path];
      if (!route && !launch) return false;
      void (async () => {
        const method = launch ? 'POST' : route!.method;
        if (req.method !== method) throw new GatewayError('GW_ERR_API_METHOD_NOT_ALLOWED', `${req.method} is not allowed on ${path}`, { hint: `Use ${method}.` });
        if (!launch) req.resume();
        if (method !== 'GET') checkOrigin(req);
        const creds = credentialsOf(req, bearerOf(req.headers.authorization));
        const session = await options.auth.resolveWebSession(creds.id, creds.bearer);
        const body = launch ? await launchApp(options, req, session, creds, launch[1]!) : await route!.run(req, session, creds);
        sendJson(res, 200, body);
      })().catch((err: unknown) => {
        const e = toGatewayError(err);
        log.info({ path, code: e.code, err: e.message }, 'web request refused');
        sendWebError(res, e);
      });
      return true;
    },
    upgrade: (req, socket, head) => terminals.upgrade(req, socket, head),
    close() {
      maintenance.close();
      terminals.close();
    },
  };
}

// --- /webapi/resources -------------------------------------------------------------------------------------------

interface Listed {
  name: string;
  labels: Record<string, string>;
}

/** What the user's roles reach among the agents this Proxy reaches: the same canAccess as every access path. */
async function resourcesOf(options: WebRoutesOptions, identity: Identity): Promise<Record<string, unknown[]>> {
  const roles = await options.auth.rolesOf(identity.roles);
  const out = { nodes: [] as unknown[], databases: [] as unknown[], apps: [] as unknown[], desktops: [] as unknown[], kube_clusters: [] as unknown[] };
  const seen = new Set<string>();
  const once = (key: string) => !seen.has(key) && !!seen.add(key);
  for (const agent of options.agents.agents()) {
    const r = agent.resources;
    if (agent.services.includes('ssh') && canAccess(roles, 'node', r.node_labels ?? {}) && once(`node/${agent.hostId}`)) {
      out.nodes.push({ name: agent.nodename, host_id: agent.hostId, hostname: agent.nodename, labels: r.node_labels ?? {}, agent: agent.nodename, online: true });
    }
    const push = <T extends Listed>(list: T[], kind: 'db' | 'app' | 'windows_desktop' | 'kube_cluster', into: unknown[], shape: (x: T) => Record<string, unknown>) => {
      for (const x of list) if (canAccess(roles, kind, x.labels) && once(`${kind}/${x.name}`)) into.push({ name: x.name, labels: x.labels, agent: agent.nodename, ...shape(x) });
    };
    push(r.databases, 'db', out.databases, (d) => ({ protocol: d.protocol }));
    push(r.apps, 'app', out.apps, (a) => ({ kind: a.kind, ...(a.public_addr ? { public_addr: a.public_addr } : {}), launch: a.kind !== 'tcp' && !!a.public_addr }));
    push(r.desktops, 'windows_desktop', out.desktops, () => ({}));
    push(r.kube_clusters, 'kube_cluster', out.kube_clusters, () => ({}));
  }
  for (const list of Object.values(out)) (list as Listed[]).sort((a, b) => a.name.localeCompare(b.name));
  return out;
}

// --- /webapi/agents ----------------------------------------------------------------------------------------------

/** cluster_maintenance_config as last read, read again after every change (watchMaintenance). */
class MaintenanceCache {
  private value: Promise<Resource | undefined> | undefined;
  private readonly unwatch: () => void;

  constructor(private readonly auth: ProxyAuth) {
    this.unwatch = auth.watchMaintenance(() => (this.value = undefined));
  }

  get(): Promise<Resource | undefined> {
    const p = (this.value ??= this.auth.maintenanceConfig());
    p.catch(() => {
      if (this.value === p) this.value = undefined;
    });
    return p;
  }

  close(): void {
    this.unwatch();
  }
}

/** Agents are an operator's view: the rule `node` with list or read (as `gwctl get nodes`). */
function mayListAgents(roles: readonly Role[]): boolean {
  return checkAccess(roles, 'node', 'list').allowed || checkAccess(roles, 'node', 'read').allowed;
}

async function agentsOf(options: WebRoutesOptions, maintenance: MaintenanceCache, identity: Identity): Promise<unknown> {
  const roles = await options.auth.rolesOf(identity.roles);
  if (!mayListAgents(roles)) {
    throw new GatewayError('GW_ERR_ACCESS_DENIED', `access denied to user "${identity.name}": none of its roles allows "list" on "node"`, {
      hint: 'Ask an administrator for a role with rules: [{resources: [node], verbs: [list, read]}] (the preset role editor has it).',
    });
  }
  const now = new Date((options.clock ?? Date.now)());
  const config = await maintenance.get();
  let window: { start: Date; end: Date } | undefined;
  try {
    window = config ? options.nextWindow(config, now) : undefined;
  } catch {
    window = undefined; // a config without agent_upgrades, or one the validator would refuse: no window
  }
  const targets = new Map<string, Promise<string | undefined>>();
  const target = (channel: string) => {
    if (!targets.has(channel)) targets.set(channel, options.targetVersion(channel).then((v) => v, () => undefined));
    return targets.get(channel)!;
  };
  const window_ = window ? { start: window.start.toISOString(), end: window.end.toISOString() } : null;
  const inWindowNow = !!window && window.start <= now && now < window.end;
  const online = options.presence();
  const agents: Array<Record<string, unknown> & { host_id: string; nodename: string }> = await Promise.all(
    online.map(async (p) => {
      const channel = p.channel ?? 'default';
      const targetVersion = await target(channel);
      return {
        host_id: p.hostId,
        nodename: p.nodename,
        services: p.services,
        version: p.version ?? null,
        channel,
        target_version: targetVersion ?? null,
        outdated: isOutdated(p.version, targetVersion),
        online: true,
        proxy: p.proxyId,
        proxies: p.proxies,
        connected_since: p.connectedAt,
        next_window: window_,
        in_window_now: inWindowNow,
      };
    }),
  );
  // Agents that joined and are not connected anywhere (Proxies' own records are not agents).
  const seen = new Set(online.map((p) => p.hostId));
  for (const n of await options.auth.listNodes()) {
    if (seen.has(n.hostId) || n.roles.every((r) => r === 'proxy')) continue;
    agents.push({ host_id: n.hostId, nodename: n.nodename, services: [], version: null, channel: null, target_version: null, outdated: false, online: false, proxy: null, next_window: window_, in_window_now: inWindowNow });
  }
  agents.sort((a, b) => a.nodename.localeCompare(b.nodename) || a.host_id.localeCompare(b.host_id));
  return { agents, maintenance: config ? ((config as { spec?: unknown }).spec ?? null) : null };
}

// --- /webapi/autoupdate/status -----------------------------------------------------------------------------------

/** The rollout is an operator's view: the rule autoupdate_agent_rollout with read (as `gwctl autoupdate status`). */
async function rolloutOf(options: WebRoutesOptions, identity: Identity): Promise<RolloutStatus> {
  const roles = await options.auth.rolesOf(identity.roles);
  if (!checkAccess(roles, 'autoupdate_agent_rollout', 'read').allowed) {
    throw new GatewayError('GW_ERR_ACCESS_DENIED', `access denied to user "${identity.name}": none of its roles allows "read" on "autoupdate_agent_rollout"`, {
      hint: 'Ask an administrator for a role with rules: [{resources: [autoupdate_agent_rollout], verbs: [read]}].',
    });
  }
  return options.rolloutStatus ? options.rolloutStatus(identity) : { managed: false, groups: [] };
}

/** An agent is out of date when its version is older than its channel's target (unknown versions are not). */
export function isOutdated(version: string | undefined, target: string | undefined): boolean {
  const v = version === undefined ? null : semver.coerce(version.replace(/^v/, ''), { includePrerelease: true });
  const t = target === undefined ? null : semver.coerce(target.replace(/^v/, ''), { includePrerelease: true });
  return v !== null && t !== null && semver.lt(v, t);
}

// --- /webapi/apps/:name/launch -----------------------------------------------------------------------------------

/** The launch route's body: at most this many bytes ({state, addr}). */
const LAUNCH_BODY_MAX = 2048;

/**
 * A launch URL on the app's own host, for the app of that name (at addr, the app host that started the launch,
 * when given): its token is bound to state, the nonce that host set in this browser, and redeemed once there
 * (webapps.ts) for the app's cookie.
 */
async function launchApp(options: WebRoutesOptions, req: http.IncomingMessage, session: WebSessionView, creds: WebCredentials, name: string): Promise<{ url: string }> {
  const { state, addr } = await launchBody(req);
  const host = addr?.replace(/:\d+$/, '');
  const roles = await options.auth.rolesOf(session.identity.roles);
  let app: { public_addr?: string; kind: string; labels: Record<string, string> } | undefined;
  for (const agent of options.agents.agents()) app ??= agent.resources.apps.find((a) => a.name === name && a.kind !== 'tcp' && !!a.public_addr && (host === undefined || a.public_addr.toLowerCase() === host) && canAccess(roles, 'app', a.labels));
  if (!app) {
    throw new GatewayError('GW_ERR_RESOURCE_NOT_FOUND', `no HTTP app "${name}"${host ? ` at ${host}` : ''} that you may open is connected`, {
      hint: 'The resources page lists the apps your roles allow; the agent that serves it may be offline.',
    });
  }
  const { token } = await options.auth.createAppLaunch(creds.id, creds.bearer, appSessionKey(name, app.public_addr!), state);
  // The app's host is served on this same port: the browser reaches it on the port it used for the Proxy.
  const port = /:(\d+)$/.exec(String(req.headers.host ?? req.headers[':authority'] ?? ''))?.[1];
  const at = port && port !== '443' ? `${app.public_addr}:${port}` : app.public_addr!;
  return { url: `https://${at}/x-gateway-auth?token=${encodeURIComponent(token)}&state=${encodeURIComponent(state)}` };
}

/** {state, addr?}: state the app host's launch nonce, addr the app host (host or host:port) that started it. */
async function launchBody(req: http.IncomingMessage): Promise<{ state: string; addr: string | undefined }> {
  const raw = await readBoundedBody(req, LAUNCH_BODY_MAX);
  let body: unknown;
  try {
    body = raw.length === 0 ? {} : JSON.parse(raw.toString('utf8'));
  } catch {
    throw new GatewayError('GW_ERR_API_BAD_REQUEST', 'the launch request body is not JSON');
  }
  const { state, addr } = (body ?? {}) as { state?: unknown; addr?: unknown };
  if (!isLaunchNonce(state)) throw launchUnbound("the launch request carries no state: an app is launched from its own host's /x-gateway-auth, which gives the page its nonce");
  if (addr !== undefined && (typeof addr !== 'string' || !/^[A-Za-z0-9.-]{1,253}(:\d{1,5})?$/.test(addr))) throw new GatewayError('GW_ERR_API_BAD_REQUEST', '"addr" must be an app host (host or host:port)');
  return { state, addr: addr?.toLowerCase() };
}
