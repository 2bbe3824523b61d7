/**
 * The Proxy's front door: the web server (API, ping, version server, connection upgrade) and the listeners
 * that lead to it and to every other protocol.
 *
 *   multiplex (TLS routing, default): one listener on web_listen_addr; the Multiplexer routes each connection
 *             by its first bytes, SNI and ALPN (see mux/multiplexer.ts).
 *   separate:  web on web_listen_addr, plus the seed's per-protocol listeners: 3023 SSH, 3024 reverse tunnels,
 *             3036 MySQL, 5432 Postgres, 27017 MongoDB, 6379 Redis, 3021 peering (kube_listen_addr if set).
 *
 * Protocol services (reverse tunnels, SSH, databases, kube, peering) plug in through `ProtocolServices`; a
 * protocol without a service yet completes its TLS handshake (so its ALPN is visible) and is closed with a log
 * line saying so.
 */
import http from 'node:http';
import type net from 'node:net';
import tls from 'node:tls';
import type { Duplex } from 'node:stream';
import { createWebSocketStream, WebSocketServer, type WebSocket } from 'ws';
import type { HostPort } from '../addr.js';
import type { GatewayConfig } from '../config/index.js';
import { logger } from '../log.js';
import { alpnBase, Multiplexer, type ConnInfo, type RouteHandler } from '../mux/multiplexer.js';
import { ConnectionLimits, limitSettings, type ListenerGuard } from '../net/deadlines.js';
import { guardHttpServer } from '../net/http.js';
import { closeServer, guardedServer, listenOn } from '../net/listen.js';
import { serverSecureContext, terminateTls } from '../net/tls.js';
import { pingResponse } from './ping.js';
import type { VersionServer } from './versions.js';

export { closeServer, listenOn };

/** The ALPN protocols the Proxy routes (ARCHITECTURE.md, wire identifiers), besides the web's. */
export const ALPN_ROUTES = [
  'gateway-reversetunnel',
  'gateway-proxy-ssh',
  'gateway-postgres',
  'gateway-mysql',
  'gateway-mongodb',
  'gateway-redis',
  'gateway-tcp',
  'gateway-peer',
] as const;
export type AlpnRoute = (typeof ALPN_ROUTES)[number];

/** A service behind the front door: gets the stream after TLS (for TLS routes) or raw (ssh, separate ports). */
export type ServiceHandler = (stream: Duplex, info: ConnInfo) => void;

export interface ProtocolServices {
  tls?: Partial<Record<AlpnRoute | 'kube', ServiceHandler>>;
  /** Raw SSH (sniffed on the web port, or the separate 3023 listener). */
  ssh?: ServiceHandler;
  /** Raw SSH reverse tunnels on the separate 3024 listener. */
  tunnel?: ServiceHandler;
}

export interface FrontDoorOptions {
  config: GatewayConfig;
  clusterName: string;
  /** TLS material for the web port and the TLS routes. */
  tls: { key: string; cert: string; ca: string[] };
  /** The Auth API router (login, join, gwctl calls). */
  api: (req: http.IncomingMessage, res: http.ServerResponse) => void;
  versions: VersionServer;
  services?: ProtocolServices;
  /** HTTP apps served under their own host names on the web port; returns false when a request is not theirs. */
  webApps?: (req: http.IncomingMessage, res: http.ServerResponse) => boolean;
  /** Extra members of the /webapi/find answer (the tunnel server's SSH host keys). */
  findExtras?: () => Record<string, unknown>;
  /** WebSocket pings on upgraded connections, to keep L7 load balancers from closing idle streams. */
  upgradePingIntervalMs?: number;
  /** Deadlines and caps of every listener (gateway.limits); made from the configuration when not given. */
  limits?: ConnectionLimits;
}

export interface FrontDoor {
  addresses: Record<string, string>;
  mux?: Multiplexer;
  limits: ConnectionLimits;
  close(): Promise<void>;
}

const UPGRADE_PATH = '/webapi/connectionupgrade';

function sendJson(res: http.ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'cache-control': 'no-store', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

/** The web server: API, ping, find, version server (connection upgrades are added by the caller). */
function createWebServer(options: FrontDoorOptions, addresses: Record<string, string>): http.Server {
  const { config } = options;
  return http.createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0]!;
    if (options.webApps?.(req, res)) return;
    if (options.versions.handle(req, res)) return;
    if (path === '/webapi/ping' || path === '/webapi/find') {
      if (req.method !== 'GET' && req.method !== 'HEAD') return sendJson(res, 405, { error: { code: 'GW_ERR_API_BAD_REQUEST', message: `${req.method} is not allowed on ${path}`, hint: 'Use GET.' } });
      const ping = pingResponse(config, options.clusterName, { web: addresses.web ?? addresses.mux, ...(addresses.ssh ? { ssh: addresses.ssh } : {}), ...(addresses.tunnel ? { tunnel: addresses.tunnel } : {}), ...(addresses.mysql ? { mysql: addresses.mysql } : {}), ...(addresses.kube ? { kube: addresses.kube } : {}) });
      return sendJson(res, 200, path === '/webapi/find' ? { proxy: ping.proxy, server_version: ping.server_version, cluster_name: ping.cluster_name, ...(options.findExtras?.() ?? {}) } : ping);
    }
    if (path === UPGRADE_PATH) {
      return sendJson(res, 426, { error: { code: 'GW_ERR_API_BAD_REQUEST', message: 'connection upgrade needs a WebSocket upgrade request', hint: `Send GET ${UPGRADE_PATH} with Upgrade: websocket and the ALPN protocol as the subprotocol.` } });
    }
    options.api(req, res);
  });
}

/** Plain HTTP on the one port: a redirect to https:// and the same path. */
function createRedirectServer(): http.Server {
  return http.createServer((req, res) => {
    const host = (req.headers.host ?? '').replace(/[^A-Za-z0-9.:[\]-]/g, '');
    const target = host ? `https://${host}${req.url ?? '/'}` : undefined;
    if (!target) {
      res.writeHead(400, { 'content-type': 'text/plain' }).end('use https://\n');
      return;
    }
    res.writeHead(308, { location: target, 'content-type': 'text/plain', connection: 'close' }).end(`use ${target}\n`);
  });
}

/**
 * Connection upgrade (L7 load balancers that end TLS themselves): the WebSocket stream is routed as if it had
 * arrived on the one port with the ALPN named as the subprotocol.
 */
function serveUpgrades(web: http.Server, mux: Multiplexer, alpnRoutes: ReadonlyMap<string, RouteHandler>, guard: ListenerGuard, pingMs: number): WebSocketServer {
  const wss = new WebSocketServer({ noServer: true, handleProtocols: (protocols) => [...protocols].find((pr) => alpnRoutes.has(alpnBase(pr))) ?? false });
  web.on('upgrade', (req: http.IncomingMessage, socket: Duplex, head: Buffer) => {
    const path = (req.url ?? '/').split('?')[0];
    const offered = String(req.headers['sec-websocket-protocol'] ?? '').split(',').map((s) => s.trim()).filter(Boolean);
    const protocol = offered.find((pr) => alpnRoutes.has(alpnBase(pr)));
    if (path !== UPGRADE_PATH || (req.headers.upgrade ?? '').toLowerCase() !== 'websocket' || !protocol) {
      const why = path !== UPGRADE_PATH ? 'no such upgrade endpoint' : !protocol ? `no routable protocol among ${JSON.stringify(offered)}` : 'only websocket upgrades are supported';
      socket.end(`HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n${why}\n`);
      return;
    }
    wss.handleUpgrade(req, socket, head, (ws: WebSocket) => {
      const stream = createWebSocketStream(ws);
      const interval = setInterval(() => ws.ping(), pingMs);
      ws.once('close', () => clearInterval(interval));
      stream.on('error', () => stream.destroy());
      guard.adopt(stream);
      const s = req.socket;
      mux.handleStream(
        stream,
        { remoteAddress: s.remoteAddress ?? '', remotePort: s.remotePort ?? 0, localAddress: s.localAddress ?? '', localPort: s.localPort ?? 0 },
        { route: alpnBase(protocol) },
      );
    });
  });
  return wss;
}

export async function startFrontDoor(options: FrontDoorOptions): Promise<FrontDoor> {
  const log = logger('proxy');
  const { config } = options;
  const p = config.proxy_service;
  const multiplex = config.auth_service.proxy_listener_mode === 'multiplex';
  const limits = options.limits ?? new ConnectionLimits(limitSettings(config));
  const deadlines = limits.settings;
  const addresses: Record<string, string> = {};
  const sockets = new Set<Duplex>();
  const track = (s: Duplex) => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  };

  const secureContext = serverSecureContext({ key: options.tls.key, cert: options.tls.cert, ca: options.tls.ca }, 'proxy');
  const terminating = (alpn: string[]) => ({ secureContext, alpn, handshakeMs: deadlines.tlsHandshakeMs });

  // --- the web server: API, ping, find, version server, connection upgrade -----------------------------------
  const web = createWebServer(options, addresses);
  const toWeb = guardHttpServer(web, deadlines, { upgrades: true });
  // Always HTTP/1.1, whatever the client offered (h2 among others routes here; h2 alone fails the handshake).
  const webRoute: RouteHandler = (stream) => {
    track(stream);
    terminateTls(stream, terminating(['http/1.1']), toWeb, (err) => log.debug({ err: err.message }, 'TLS on the web port failed'));
  };

  // --- TLS routes ---------------------------------------------------------------------------------------------
  const terminate = (name: string, service: ServiceHandler | undefined): RouteHandler => (stream, info) => {
    track(stream);
    terminateTls(
      stream,
      terminating(info.alpn ? [info.alpn] : []),
      (socket) => {
        if (service) return service(socket, info);
        log.info({ route: name, client: `${info.remoteAddress}:${info.remotePort}` }, `no ${name} service runs behind this proxy yet; closing`);
        socket.end();
      },
      (err) => log.debug({ route: name, err: err.message }, 'TLS on a routed connection failed'),
    );
  };
  const alpnRoutes = new Map<string, RouteHandler>(ALPN_ROUTES.map((r) => [r, terminate(r, options.services?.tls?.[r])]));
  const raw = (name: string, service: ServiceHandler | undefined): RouteHandler => (stream, info) => {
    track(stream);
    if (service) return service(stream, info);
    log.info({ route: name, client: `${info.remoteAddress}:${info.remotePort}` }, `no ${name} service runs behind this proxy yet; closing`);
    stream.destroy();
  };
  const redirect = createRedirectServer();
  const toRedirect = guardHttpServer(redirect, deadlines);

  const mux = new Multiplexer({
    alpn: alpnRoutes,
    web: webRoute,
    kube: terminate('kube', options.services?.tls?.kube),
    ssh: raw('ssh', options.services?.ssh),
    http: (stream) => {
      track(stream);
      toRedirect(stream);
    },
    proxyProtocol: p.proxy_protocol === 'on',
    detectTimeoutMs: p.detect_timeout,
  });
  const wss = serveUpgrades(web, mux, alpnRoutes, limits.listener('upgrade'), options.upgradePingIntervalMs ?? 30_000);

  const listeners = listenerTable(p, multiplex, { mux, webRoute, raw, terminate, services: options.services ?? {} });
  const servers: net.Server[] = [];
  try {
    for (const [name, addr, key, onSocket] of listeners) {
      if (!addr) continue;
      // With PROXY headers on, the one port learns the client's address only from the header (the mux counts it).
      const guard = limits.listener(name, { sourceAtAccept: !(multiplex && p.proxy_protocol === 'on') });
      const server = guardedServer(guard, (socket) => {
        track(socket);
        onSocket(socket);
      });
      servers.push(server);
      addresses[name] = await listenOn(server, addr, key);
    }
    if (multiplex) log.info({ addr: addresses.web, tls_routing: true }, 'proxy listening: every protocol on the web port');
    else log.info({ addresses, tls_routing: false }, 'proxy listening on separate ports');
  } catch (err) {
    await Promise.all(servers.map(closeServer));
    throw err;
  }

  return {
    addresses,
    mux,
    limits,
    async close() {
      // Stop accepting first, then drop every connection the listeners ever accepted (a client that reconnects
      // at once, such as an agent told to reconnect, must not keep the shutdown waiting).
      const closed = Promise.all([...servers.map(closeServer), closeServer(web), closeServer(redirect)]);
      for (const s of sockets) s.destroy();
      wss.close();
      await closed;
    },
  };
}

type Listener = [name: string, addr: HostPort | undefined, key: string, onSocket: (socket: net.Socket) => void];

/** The listeners of a listener mode: the one port, or the seed's separate ports. */
function listenerTable(
  p: GatewayConfig['proxy_service'],
  multiplex: boolean,
  r: { mux: Multiplexer; webRoute: RouteHandler; raw: (name: string, service: ServiceHandler | undefined) => RouteHandler; terminate: (name: string, service: ServiceHandler | undefined) => RouteHandler; services: ProtocolServices },
): Listener[] {
  if (multiplex) return [['web', p.web_listen_addr, 'proxy_service.web_listen_addr', (s) => r.mux.handleSocket(s)]];
  const tlsRoute = (route: AlpnRoute | 'kube') => (s: net.Socket) => r.terminate(route, r.services.tls?.[route])(s, infoOf(s, route));
  return [
    ['web', p.web_listen_addr, 'proxy_service.web_listen_addr', (s) => r.webRoute(s, infoOf(s, 'web'))],
    ['ssh', p.listen_addr, 'proxy_service.listen_addr', (s) => r.raw('ssh', r.services.ssh)(s, infoOf(s, 'ssh'))],
    ['tunnel', p.tunnel_listen_addr, 'proxy_service.tunnel_listen_addr', (s) => r.raw('tunnel', r.services.tunnel)(s, infoOf(s, 'tunnel'))],
    ['peer', p.peer_listen_addr, 'proxy_service.peer_listen_addr', (s) => r.mux.handleSocket(s)],
    ['mysql', p.mysql_listen_addr, 'proxy_service.mysql_listen_addr', tlsRoute('gateway-mysql')],
    ['postgres', p.postgres_listen_addr, 'proxy_service.postgres_listen_addr', tlsRoute('gateway-postgres')],
    ['mongo', p.mongo_listen_addr, 'proxy_service.mongo_listen_addr', tlsRoute('gateway-mongodb')],
    ['redis', p.redis_listen_addr, 'proxy_service.redis_listen_addr', tlsRoute('gateway-redis')],
    ['kube', p.kube_listen_addr, 'proxy_service.kube_listen_addr', tlsRoute('kube')],
  ];
}

function infoOf(socket: net.Socket, route: string): ConnInfo {
  return {
    remoteAddress: socket.remoteAddress ?? '',
    remotePort: socket.remotePort ?? 0,
    localAddress: socket.localAddress ?? '',
    localPort: socket.localPort ?? 0,
    route,
  };
}
