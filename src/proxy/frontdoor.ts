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
import https from 'node:https';
import net from 'node:net';
import tls from 'node:tls';
import type { Duplex } from 'node:stream';
import { createWebSocketStream, WebSocketServer, type WebSocket } from 'ws';
import { formatHostPort, type HostPort } from '../addr.js';
import type { GatewayConfig } from '../config/index.js';
import { GatewayError } from '../errors.js';
import { logger } from '../log.js';
import { alpnBase, Multiplexer, type ConnInfo, type RouteHandler } from '../mux/multiplexer.js';
import { pingResponse } from './ping.js';
import type { VersionServer } from './versions.js';

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
  tlsHandshakeTimeoutMs?: number;
}

export interface FrontDoor {
  addresses: Record<string, string>;
  mux?: Multiplexer;
  close(): Promise<void>;
}

const UPGRADE_PATH = '/webapi/connectionupgrade';

function sendJson(res: http.ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'cache-control': 'no-store', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

export function listenOn(server: net.Server, addr: HostPort, what: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const onError = (err: NodeJS.ErrnoException) => {
      const where = formatHostPort(addr.host, addr.port);
      const hint =
        err.code === 'EADDRINUSE'
          ? `Another process listens on ${where}: stop it or change ${what} in the configuration.`
          : err.code === 'EACCES'
            ? `Ports below 1024 need root or CAP_NET_BIND_SERVICE; run as root or choose a port of 1024 or more for ${what}.`
            : err.code === 'EADDRNOTAVAIL'
              ? `No interface of this machine has the address ${addr.host}; change ${what}.`
              : `Check ${what} in the configuration.`;
      reject(new GatewayError('GW_ERR_LISTEN', `cannot listen on ${where} (${what}): ${err.code ?? err.message}`, { hint, cause: err }));
    };
    server.once('error', onError);
    server.listen({ port: addr.port, host: addr.host, backlog: 4096 }, () => {
      server.off('error', onError);
      const a = server.address() as net.AddressInfo;
      resolve(formatHostPort(a.address, a.port));
    });
  });
}

/** Stops listening and closes open HTTP connections; resolves once the server has closed. */
export function closeServer(server: net.Server): Promise<void> {
  return new Promise((resolve) => {
    server.close(() => resolve());
    if ('closeAllConnections' in server) (server as http.Server).closeAllConnections();
  });
}

export async function startFrontDoor(options: FrontDoorOptions): Promise<FrontDoor> {
  const log = logger('proxy');
  const { config } = options;
  const p = config.proxy_service;
  const multiplex = config.auth_service.proxy_listener_mode === 'multiplex';
  const servers: net.Server[] = [];
  const addresses: Record<string, string> = {};
  const sockets = new Set<Duplex>();
  const track = (s: Duplex) => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  };

  const secureContext = tls.createSecureContext({ key: options.tls.key, cert: options.tls.cert, ca: options.tls.ca });
  const handshakeTimeout = options.tlsHandshakeTimeoutMs ?? 10_000;

  // --- the web server: API, ping, find, version server, connection upgrade -----------------------------------
  const web = https.createServer(
    { key: options.tls.key, cert: options.tls.cert, ca: options.tls.ca, requestCert: true, rejectUnauthorized: false, handshakeTimeout, ALPNProtocols: ['http/1.1'] },
    (req, res) => {
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
    },
  );

  // --- TLS routes ---------------------------------------------------------------------------------------------
  const terminate = (name: string, service: ServiceHandler | undefined): RouteHandler => (stream, info) => {
    track(stream);
    const socket = new tls.TLSSocket(stream as net.Socket, {
      isServer: true,
      secureContext,
      requestCert: true,
      rejectUnauthorized: false,
      ALPNProtocols: info.alpn ? [info.alpn] : [],
    });
    const timer = setTimeout(() => socket.destroy(), handshakeTimeout);
    socket.once('secure', () => {
      clearTimeout(timer);
      // A TLSSocket made by hand is not checked the way tls.Server checks its own (onServerSocketSecure):
      // record the client certificate's verification here so that handlers can rely on .authorized.
      const verifyError = (socket as unknown as { _handle?: { verifyError(): Error & { code?: string } | null } })._handle?.verifyError();
      if (verifyError) socket.authorizationError = (verifyError.code ?? verifyError.message) as never;
      else if (socket.getPeerCertificate()?.raw) socket.authorized = true;
      if (service) {
        service(socket, info);
        return;
      }
      log.info({ route: name, client: `${info.remoteAddress}:${info.remotePort}` }, `no ${name} service runs behind this proxy yet; closing`);
      socket.end();
    });
    socket.once('error', (err) => {
      clearTimeout(timer);
      log.debug({ route: name, err: err.message }, 'TLS on a routed connection failed');
      socket.destroy();
    });
  };
  const alpnRoutes = new Map<string, RouteHandler>(ALPN_ROUTES.map((r) => [r, terminate(r, options.services?.tls?.[r])]));
  const webRoute: RouteHandler = (stream) => {
    track(stream);
    web.emit('connection', stream);
  };
  const raw = (name: string, service: ServiceHandler | undefined): RouteHandler => (stream, info) => {
    track(stream);
    if (service) return service(stream, info);
    log.info({ route: name, client: `${info.remoteAddress}:${info.remotePort}` }, `no ${name} service runs behind this proxy yet; closing`);
    stream.destroy();
  };
  const redirect = http.createServer((req, res) => {
    const host = (req.headers.host ?? '').replace(/[^A-Za-z0-9.:[\]-]/g, '');
    const target = host ? `https://${host}${req.url ?? '/'}` : undefined;
    if (!target) {
      res.writeHead(400, { 'content-type': 'text/plain' }).end('use https://\n');
      return;
    }
    res.writeHead(308, { location: target, 'content-type': 'text/plain', connection: 'close' }).end(`use ${target}\n`);
  });

  const mux = new Multiplexer({
    alpn: alpnRoutes,
    web: webRoute,
    kube: terminate('kube', options.services?.tls?.kube),
    ssh: raw('ssh', options.services?.ssh),
    http: (stream) => {
      track(stream);
      redirect.emit('connection', stream);
    },
    proxyProtocol: p.proxy_protocol === 'on',
    detectTimeoutMs: p.detect_timeout,
  });

  // --- connection upgrade (L7 load balancers that end TLS themselves) ---------------------------------------------
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
      const interval = setInterval(() => ws.ping(), options.upgradePingIntervalMs ?? 30_000);
      ws.once('close', () => clearInterval(interval));
      stream.on('error', () => stream.destroy());
      const s = req.socket;
      mux.handleStream(
        stream,
        { remoteAddress: s.remoteAddress ?? '', remotePort: s.remotePort ?? 0, localAddress: s.localAddress ?? '', localPort: s.localPort ?? 0 },
        { route: alpnBase(protocol) },
      );
    });
  });

  try {
    if (multiplex) {
      const server = net.createServer({ noDelay: true, allowHalfOpen: true }, mux.handleSocket);
      server.on('connection', track);
      servers.push(server);
      addresses.web = await listenOn(server, p.web_listen_addr, 'proxy_service.web_listen_addr');
      log.info({ addr: addresses.web, tls_routing: true }, 'proxy listening: every protocol on the web port');
    } else {
      servers.push(web);
      web.on('connection', track);
      addresses.web = await listenOn(web, p.web_listen_addr, 'proxy_service.web_listen_addr');
      const separate: Array<[string, HostPort | undefined, string, (socket: net.Socket) => void]> = [
        ['ssh', p.listen_addr, 'proxy_service.listen_addr', (s) => raw('ssh', options.services?.ssh)(s, infoOf(s, 'ssh'))],
        ['tunnel', p.tunnel_listen_addr, 'proxy_service.tunnel_listen_addr', (s) => raw('tunnel', options.services?.tunnel)(s, infoOf(s, 'tunnel'))],
        ['peer', p.peer_listen_addr, 'proxy_service.peer_listen_addr', (s) => mux.handleSocket(s)],
        ['mysql', p.mysql_listen_addr, 'proxy_service.mysql_listen_addr', (s) => terminate('gateway-mysql', options.services?.tls?.['gateway-mysql'])(s, infoOf(s, 'gateway-mysql'))],
        ['postgres', p.postgres_listen_addr, 'proxy_service.postgres_listen_addr', (s) => terminate('gateway-postgres', options.services?.tls?.['gateway-postgres'])(s, infoOf(s, 'gateway-postgres'))],
        ['mongo', p.mongo_listen_addr, 'proxy_service.mongo_listen_addr', (s) => terminate('gateway-mongodb', options.services?.tls?.['gateway-mongodb'])(s, infoOf(s, 'gateway-mongodb'))],
        ['redis', p.redis_listen_addr, 'proxy_service.redis_listen_addr', (s) => terminate('gateway-redis', options.services?.tls?.['gateway-redis'])(s, infoOf(s, 'gateway-redis'))],
        ['kube', p.kube_listen_addr, 'proxy_service.kube_listen_addr', (s) => terminate('kube', options.services?.tls?.kube)(s, infoOf(s, 'kube'))],
      ];
      for (const [name, addr, key, onConnection] of separate) {
        if (!addr) continue;
        const server = net.createServer({ noDelay: true, allowHalfOpen: true }, onConnection);
        server.on('connection', track);
        servers.push(server);
        addresses[name] = await listenOn(server, addr, key);
      }
      log.info({ addresses, tls_routing: false }, 'proxy listening on separate ports');
    }
  } catch (err) {
    await Promise.all(servers.map(closeServer));
    throw err;
  }

  return {
    addresses,
    mux,
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

function infoOf(socket: net.Socket, route: string): ConnInfo {
  return {
    remoteAddress: socket.remoteAddress ?? '',
    remotePort: socket.remotePort ?? 0,
    localAddress: socket.localAddress ?? '',
    localPort: socket.localPort ?? 0,
    route,
  };
}
