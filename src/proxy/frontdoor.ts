/**
 * The Proxy's front door: the web server (API, ping, version server, connection upgrade) and the listeners
 * that lead to it and to every other protocol. What it serves is the protocol table (protocols.ts); this file
 * only says how each kind of route is served:
 *
 *   web        TLS ends here (ALPN h2, http/1.1, or none: HTTP/1.1), then the web server (src/net/http2.ts):
 *              API, ping, find, version server, the Web UI's files (static.ts), connection upgrade
 *   redirect   plain HTTP: a redirect to https://
 *   ssh        the raw stream, to the ssh service (the SSH jump host)
 *   e2e, data  the raw stream too (the ClientHello pushed back, unopened), to the relay of end-to-end streams
 *              and the agents' data connections (e2erelay.ts, e2edata.ts): the Proxy holds no key of these
 *   kube, tunnel, resource, grant
 *              TLS ends here, with the ALPN the client chose, then the service of that kind
 *
 *   multiplex (TLS routing, default): one listener on web_listen_addr; the Multiplexer routes each connection
 *             by its first bytes, SNI and ALPN to the table's rows (see mux/multiplexer.ts). With
 *             tunnel_public_addr set, the reverse-tunnel listener (tunnel_listen_addr, raw SSH) too: the lower
 *             rung of the agents' transport ladder (src/agent/ladder.ts) for networks that block the one port.
 *   separate:  the table's listeners (src/wire/protocols.ts: web on web_listen_addr, 3023 SSH, 3024 reverse
 *             tunnels, one per database protocol, kube_listen_addr if set).
 *
 * Services plug in by route kind through `ProtocolServices`; a kind without a service yet completes its TLS
 * handshake (so its ALPN is visible) and is closed with a log line saying so. Proxy peering (3021) is not the
 * front door's: it has its own listener in both modes (peer.ts, started by src/roles/proxy.ts).
 */
import { constants } from 'node:crypto';
import http from 'node:http';
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import type { SecureContext } from 'node:tls';
import { WebSocketServer, type WebSocket } from 'ws';
import { formatHostPort } from '../addr.js';
import type { GatewayConfig } from '../config/index.js';
import { GatewayError } from '../errors.js';
import { logger, type Logger } from '../log.js';
import { clientOf, Multiplexer, type ConnInfo, type MuxRoute, type RouteHandler } from '../mux/multiplexer.js';
import { anySourceBelieved } from '../mux/trust.js';
import { ConnectionLimits, limitSettings, type ListenerGuard } from '../net/deadlines.js';
import { guardHttpServer } from '../net/http.js';
import { createWebServer, type Http2Caps, type WebServer } from '../net/http2.js';
import { closeServer, guardedServer, listenOn } from '../net/listen.js';
import { serverSecureContext, terminateTls } from '../net/tls.js';
import { cameThroughUpgrade, clientAddress, markUpgraded } from '../stream/meta.js';
import { webSocketDuplex } from '../stream/websocket.js';
import type { AuthPreference } from '../auth/sso/index.js';
import { pingResponse } from './ping.js';
import { muxMatchOf, PROTOCOLS, upgradeRouteFor, type Protocol, type ServiceKindOfRoute, type SeparateListener } from './protocols.js';
import { StaticSite } from './static.js';
import type { VersionServer } from './versions.js';
import type { ArtifactRelay } from './artifacts.js';
import { sendJson, sendWebError } from './webanswer.js';
import { FIND_PATH, PING_PATH, UPGRADE_MAX_PAYLOAD, UPGRADE_PATH, UPGRADE_TRANSPORT, type FindExtras, type FindResponse } from '../wire/ping.js';

export { closeServer, listenOn };

/** A service behind the front door: gets the stream after TLS (for TLS routes) or raw (ssh, raw listeners). */
export type ServiceHandler = (stream: Duplex, info: ConnInfo) => void;

/**
 * The services behind the front door, by the kind of route they serve: every row of that kind goes to it
 * (resource: every database, TCP and gateway-proxy-ssh route; tunnel: the reverse tunnels over TLS on the one
 * port and raw on their separate listener).
 */
export type ProtocolServices = Partial<Record<ServiceKindOfRoute, ServiceHandler>>;

export interface FrontDoorOptions {
  config: GatewayConfig;
  clusterName: string;
  /** TLS material for the web port and the TLS routes. */
  tls: { key: string; cert: string; ca: string[] };
  /** The Auth API router (login, join, gwctl calls). */
  api: (req: http.IncomingMessage, res: http.ServerResponse) => void;
  versions: VersionServer;
  /** Release artifacts and the package repository relayed for agents (artifacts.ts); returns false when a request is not theirs. */
  artifacts?: Pick<ArtifactRelay, 'handle'>;
  /** The managed rollout's answer to upgraders (autoupdate.ts); absent: that path is the API's (404). */
  autoupdate?: { handle(req: http.IncomingMessage, res: http.ServerResponse): boolean };
  services?: ProtocolServices;
  /** HTTP apps served under their own host names on the web port; returns false when a request is not theirs. */
  webApps?: (req: http.IncomingMessage, res: http.ServerResponse) => boolean;
  /** Connection upgrades (WebSocket, any 101) to HTTP apps under their own host names (appupgrade.ts); false when not theirs. */
  webAppUpgrades?: (req: http.IncomingMessage, socket: Duplex, head: Buffer) => boolean;
  /** The Web UI's routes of the Proxy (web.ts): requests before the API router, the terminal's WebSocket upgrades. */
  web?: { handle(req: http.IncomingMessage, res: http.ServerResponse): boolean; upgrade(req: http.IncomingMessage, socket: Duplex, head: Buffer): boolean };
  /** How users sign in, for /webapi/ping (cachedAuthPreference in ping.ts); local when not given. */
  authPreference?: () => Promise<AuthPreference>;
  /** Extra members of the /webapi/find answer (the tunnel server's SSH host keys). */
  findExtras?: () => FindExtras;
  /** WebSocket pings on upgraded connections, to keep L7 load balancers from closing idle streams. */
  upgradePingIntervalMs?: number;
  /** Deadlines and caps of every listener (gateway.limits); made from the configuration when not given. */
  limits?: ConnectionLimits;
  /** The protocols served; the table in protocols.ts unless a test says otherwise. */
  protocols?: readonly Protocol[];
  /** The Web UI's files: dist/web of this installation unless a test says otherwise. */
  webRoot?: string;
  /** HTTP/2 caps of the web port (HTTP2_CAPS unless a test lowers them). */
  http2Caps?: Partial<Http2Caps>;
}

export interface FrontDoor {
  addresses: Record<string, string>;
  mux?: Multiplexer;
  limits: ConnectionLimits;
  /** SIGHUP: the sources PROXY headers are believed from (proxy_service.proxy_protocol_trusted_sources), for new headers. */
  setProxyProtocolTrusted(sources: readonly string[]): void;
  /** Each bound listener and whether it is listening now (the Proxy's readiness, src/roles/health.ts). */
  listening(): Array<{ name: string; address: string; listening: boolean }>;
  close(): Promise<void>;
}

/** The web server's requests: API, ping, find, version server, the Web UI (connection upgrades are the caller's). */
function webRequests(options: FrontDoorOptions, addresses: Record<string, string>, site: StaticSite): http.RequestListener {
  const { config } = options;
  return (req, res) => {
    const path = (req.url ?? '/').split('?')[0]!;
    if (options.webApps?.(req, res)) return;
    if (options.versions.handle(req, res)) return;
    if (options.artifacts?.handle(req, res)) return;
    if (options.autoupdate?.handle(req, res)) return;
    if (path === PING_PATH || path === FIND_PATH) {
      if (req.method !== 'GET' && req.method !== 'HEAD') return sendWebError(res, new GatewayError('GW_ERR_API_METHOD_NOT_ALLOWED', `${req.method} is not allowed on ${path}`, { hint: 'Use GET.' }));
      // Every listener's bound address by its name (the table's), so that ping reports a port 0 as the one bound.
      const web = addresses.web ?? addresses.mux;
      const bound = web === undefined ? addresses : { ...addresses, web };
      const ping = pingResponse(config, options.clusterName, bound);
      if (path === FIND_PATH) return sendJson(res, 200, { proxy: ping.proxy, server_version: ping.server_version, cluster_name: ping.cluster_name, ...(options.findExtras?.() ?? {}) } satisfies FindResponse);
      if (!options.authPreference) return sendJson(res, 200, ping);
      return void options.authPreference().then((p) => sendJson(res, 200, pingResponse(config, options.clusterName, bound, p)));
    }
    if (path === UPGRADE_PATH) {
      return sendWebError(res, new GatewayError('GW_ERR_API_UPGRADE_REQUIRED', 'connection upgrade needs a WebSocket upgrade request', { hint: `Send GET ${UPGRADE_PATH} with Upgrade: websocket and the ALPN protocol as the subprotocol.` }));
    }
    if (options.web?.handle(req, res)) return;
    if (site.handle(req, res)) return;
    options.api(req, res);
  };
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

/** Why an upgrade request is refused (400), or undefined when it is served. */
function upgradeRefusal(req: http.IncomingMessage, path: string | undefined, offered: readonly string[], routable: boolean): string | undefined {
  if (path !== UPGRADE_PATH) return 'no such upgrade endpoint';
  if ((req.headers.upgrade ?? '').toLowerCase() !== 'websocket') return 'only websocket upgrades are supported';
  if (!routable) return `no routable protocol among ${JSON.stringify(offered)}`;
  // A loop (the transport inside itself), never a client's need: each layer would be another TLS in TLS.
  if (cameThroughUpgrade(req.socket)) return 'a connection that came through an upgrade cannot be upgraded again';
  return undefined;
}

/**
 * Connection upgrade: the WebSocket stream is handed to the multiplexer as if it had arrived on the one port,
 * either to the route of the ALPN named as the subprotocol (L7 load balancers that end TLS themselves) or, with
 * UPGRADE_TRANSPORT, to whatever route its own ClientHello asks for (the transport through TLS-inspecting
 * proxies). This only adapts the stream: routing is the multiplexer's. The stream counts against the listener
 * "upgrade"'s caps; the multiplexer's detect deadline and the route's TLS deadline apply inside it.
 */
function serveUpgrades(web: WebServer['server'], mux: Multiplexer, protocols: readonly Protocol[], guard: ListenerGuard, pingMs: number, webRoutes?: FrontDoorOptions['web'], appUpgrades?: FrontDoorOptions['webAppUpgrades']): WebSocketServer {
  const routable = (pr: string) => pr === UPGRADE_TRANSPORT || upgradeRouteFor(pr, protocols) !== undefined;
  const wss = new WebSocketServer({ noServer: true, maxPayload: UPGRADE_MAX_PAYLOAD, handleProtocols: (offered) => [...offered].find(routable) ?? false });
  web.on('upgrade', (req: http.IncomingMessage, socket: Duplex, head: Buffer) => {
    // An app's host first, as for its requests (webRequests): its upgrades are the app's, whatever the path.
    if (appUpgrades?.(req, socket, head)) return;
    if (webRoutes?.upgrade(req, socket, head)) return;
    const path = (req.url ?? '/').split('?')[0];
    const offered = String(req.headers['sec-websocket-protocol'] ?? '').split(',').map((s) => s.trim()).filter(Boolean);
    const protocol = offered.find(routable);
    const why = upgradeRefusal(req, path, offered, protocol !== undefined);
    if (why !== undefined) return void socket.end(`HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n${why}\n`);
    if (!guard.hasRoom()) return void socket.end('HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\ntoo many upgraded connections\n');
    const route = protocol === UPGRADE_TRANSPORT ? {} : { route: upgradeRouteFor(protocol!, protocols)!.name };
    wss.handleUpgrade(req, socket, head, (ws: WebSocket) => {
      const stream = webSocketDuplex(ws, UPGRADE_MAX_PAYLOAD);
      const interval = setInterval(() => ws.ping(), pingMs);
      ws.once('close', () => clearInterval(interval));
      stream.on('error', () => stream.destroy());
      if (!guard.adopt(stream)) return;
      markUpgraded(stream);
      const s = req.socket;
      // The client is the request's: the address a trusted PROXY header gave its connection, else its peer.
      const client = clientAddress(s);
      mux.handleStream(stream, { remoteAddress: client.address, remotePort: client.port, localAddress: s.localAddress ?? '', localPort: s.localPort ?? 0 }, route);
    });
  });
  return wss;
}

/** Every stream the door handed on, so that close() can drop them all. */
class Streams {
  private readonly open = new Set<Duplex>();

  track = (s: Duplex): void => {
    this.open.add(s);
    s.once('close', () => this.open.delete(s));
  };

  destroyAll(): void {
    for (const s of this.open) s.destroy();
  }
}

/** How each kind of route is served (the list at the top of this file). */
class RouteHandlers {
  readonly redirect = createRedirectServer();
  private readonly toRedirect: (stream: Duplex) => void;
  private readonly secureContext;
  /** The agents' tunnels: the same credentials, no session tickets (why: docs/tunnels.md "Memory per idle agent"). */
  private readonly tunnelContext;
  private readonly services: ProtocolServices;

  constructor(
    options: FrontDoorOptions,
    private readonly webServer: WebServer,
    private readonly limits: ConnectionLimits,
    private readonly streams: Streams,
    private readonly log: Logger,
  ) {
    this.secureContext = serverSecureContext({ key: options.tls.key, cert: options.tls.cert, ca: options.tls.ca }, 'proxy');
    this.tunnelContext = serverSecureContext({ key: options.tls.key, cert: options.tls.cert, ca: options.tls.ca, secureOptions: constants.SSL_OP_NO_TICKET }, 'proxy-tunnel');
    this.toRedirect = guardHttpServer(this.redirect, limits.settings);
    this.services = options.services ?? {};
  }

  /** The handler of a row: what the multiplexer hands its connections to, and its TLS listener in separate mode. */
  of(row: Protocol): RouteHandler {
    switch (row.kind) {
      case 'web':
        return this.web;
      case 'redirect':
        return this.redirectRoute;
      case 'ssh':
      case 'e2e': // the client's TLS with the agent passes through unopened (e2erelay.ts)
      case 'data': // an agent's data connection: not TLS (e2edata.ts)
        return this.raw(row.name, row);
      default:
        return this.terminate(row.name, this.services[row.kind], row.kind === 'tunnel' ? this.tunnelContext : this.secureContext);
    }
  }

  /** The raw bytes to the row's service, under the name `name` (a separate listener's). */
  raw(name: string, row: Protocol): RouteHandler {
    const service = row.kind === 'web' || row.kind === 'redirect' ? undefined : this.services[row.kind];
    return (stream, info) => {
      this.streams.track(stream);
      if (service) return service(stream, info);
      this.absent(name, info);
      stream.destroy();
    };
  }

  // h2 or http/1.1 (the client's choice among them; none offered: HTTP/1.1), TLS and all in src/net/http2.ts.
  private readonly web: RouteHandler = (stream) => {
    this.streams.track(stream);
    this.webServer.accept(stream);
  };

  private readonly redirectRoute: RouteHandler = (stream) => {
    this.streams.track(stream);
    this.toRedirect(stream);
  };

  /** TLS ends here with the protocol the client chose (none on a separate listener), then the service. */
  private terminate(name: string, service: ServiceHandler | undefined, secureContext: SecureContext): RouteHandler {
    return (stream, info) => {
      this.streams.track(stream);
      terminateTls(
        stream,
        { secureContext, alpn: info.alpn ? [info.alpn] : [], handshakeMs: this.limits.settings.tlsHandshakeMs },
        (socket) => {
          if (service) return service(socket, info);
          this.absent(name, info);
          socket.end();
        },
        (err) => this.log.debug({ route: name, err: err.message }, 'TLS on a routed connection failed'),
      );
    };
  }

  private absent(name: string, info: ConnInfo): void {
    this.log.info({ route: name, client: clientOf(info) }, `no ${name} service runs behind this proxy yet; closing`);
  }
}

export async function startFrontDoor(options: FrontDoorOptions): Promise<FrontDoor> {
  const log = logger('proxy');
  const p = options.config.proxy_service;
  const multiplex = options.config.auth_service.proxy_listener_mode === 'multiplex';
  const protocols = options.protocols ?? PROTOCOLS;
  const limits = options.limits ?? new ConnectionLimits(limitSettings(options.config));
  const addresses: Record<string, string> = {};
  const streams = new Streams();

  const site = await StaticSite.load({ ...(options.webRoot ? { root: options.webRoot } : {}), log });
  const web = createWebServer(
    {
      credentials: { key: options.tls.key, cert: options.tls.cert, ca: options.tls.ca },
      name: 'proxy-web',
      settings: limits.settings,
      ...(options.http2Caps ? { caps: options.http2Caps } : {}),
      onTlsError: (err) => log.debug({ err: err.message }, 'TLS on the web port failed'),
    },
    webRequests(options, addresses, site),
  );
  const routes = new RouteHandlers(options, web, limits, streams, log);
  const mux = new Multiplexer({
    routes: protocols.map((row): MuxRoute => ({ name: row.name, match: muxMatchOf(row), handler: routes.of(row) })),
    proxyProtocol: p.proxy_protocol === 'on',
    proxyProtocolTrusted: p.proxy_protocol_trusted_sources,
    detectTimeoutMs: p.detect_timeout,
  });
  // The one port's refusals by reason (a PROXY header from an unlisted source among them) in the minute's counters.
  if (multiplex) limits.publish('mux', () => ({ refused: mux.getStats().refused }));
  const wss = serveUpgrades(web.server, mux, protocols, limits.listener('upgrade'), options.upgradePingIntervalMs ?? 30_000, options.web, options.webAppUpgrades);

  const listeners = multiplex ? [onePort(protocols, mux), ...tunnelBeside(protocols, mux, routes, p)] : separateListeners(protocols, mux, routes);
  // With PROXY headers on, the one port learns the client's address only from the header (the mux counts it).
  const sourceAtAccept = !(multiplex && p.proxy_protocol === 'on');
  const named: Array<{ name: string; server: net.Server }> = [];
  const servers = await bindListeners(listeners, p, { limits, sourceAtAccept, streams, addresses, named });
  if (multiplex) log.info({ addr: addresses.web, tls_routing: true }, 'proxy listening: every protocol on the web port');
  if (anySourceBelieved({ onePort: multiplex, proxyProtocol: p.proxy_protocol === 'on', sources: p.proxy_protocol_trusted_sources })) warnAnySource(log, addresses.web);
  else log.info({ addresses, tls_routing: false }, 'proxy listening on separate ports');

  return {
    addresses,
    mux,
    limits,
    setProxyProtocolTrusted(sources) {
      const policy = mux.setProxyProtocolTrusted(sources);
      if (!multiplex || policy.mode === 'off') return;
      if (policy.mode === 'any') warnAnySource(log, addresses.web);
      else log.info({ addr: addresses.web, proxy_protocol_trusted_sources: sources }, 'PROXY headers are believed from these sources only (new connections)');
    },
    listening: () => named.map(({ name, server }) => ({ name, address: addresses[name] ?? '', listening: server.listening })),
    async close() {
      // Stop accepting first, then drop every connection the listeners ever accepted (a client that reconnects
      // at once, such as an agent told to reconnect, must not keep the shutdown waiting).
      const closed = Promise.all([...servers.map(closeServer), closeServer(routes.redirect)]);
      web.close();
      streams.destroyAll();
      wss.close();
      await closed;
    },
  };
}

function warnAnySource(log: Logger, addr: string | undefined): void {
  log.warn(
    { addr, proxy_protocol: 'on', proxy_protocol_trusted_sources: [] },
    'a PROXY header is believed from any source: list the load balancers in proxy_service.proxy_protocol_trusted_sources, or a client that reaches this port directly picks the address it is rate-limited and audited under',
  );
}

interface Listener extends SeparateListener {
  onSocket: (socket: net.Socket) => void;
}

/** TLS routing: every protocol on the web row's address, through the multiplexer. */
function onePort(protocols: readonly Protocol[], mux: Multiplexer): Listener {
  const web = protocols.find((row) => row.kind === 'web')?.listener;
  if (!web) throw new GatewayError('GW_ERR_INTERNAL', 'the protocol table has no web listener for the one port');
  return { ...web, accepts: 'mux', onSocket: (s) => mux.handleSocket(s) };
}

/** Multiplex mode: the tunnel row's own listener as well, when the Proxy advertises it (tunnel_public_addr). */
function tunnelBeside(protocols: readonly Protocol[], mux: Multiplexer, routes: RouteHandlers, p: GatewayConfig['proxy_service']): Listener[] {
  if (p.tunnel_public_addr.length === 0) return [];
  return separateListeners(protocols.filter((row) => row.listener?.name === 'tunnel'), mux, routes);
}

/** Separate listeners: each row's own, in the table's order. */
function separateListeners(protocols: readonly Protocol[], mux: Multiplexer, routes: RouteHandlers): Listener[] {
  return protocols.flatMap((row): Listener[] => {
    const l = row.listener;
    if (!l) return [];
    switch (l.accepts) {
      case 'mux':
        return [{ ...l, onSocket: (s) => mux.handleSocket(s) }];
      case 'tls': {
        const handler = routes.of(row);
        return [{ ...l, onSocket: (s) => handler(s, infoOf(s, row.name)) }];
      }
      case 'raw': {
        // Raw bytes carry no ALPN: the connection is named after its listener ("tunnel").
        const handler = routes.raw(l.name, row);
        return [{ ...l, onSocket: (s) => handler(s, infoOf(s, l.name)) }];
      }
    }
  });
}

/** Binds each listener that has an address; on a failure, closes those bound before it and throws. */
async function bindListeners(
  listeners: readonly Listener[],
  p: GatewayConfig['proxy_service'],
  o: { limits: ConnectionLimits; sourceAtAccept: boolean; streams: Streams; addresses: Record<string, string>; named?: Array<{ name: string; server: net.Server }> },
): Promise<net.Server[]> {
  const clash = sharedAddress(listeners, p);
  if (clash) {
    throw new GatewayError('GW_ERR_LISTEN', `cannot listen on ${clash.addr} (proxy_service.${clash.second}): proxy_service.${clash.first} is the same address`, {
      hint: `Give proxy_service.${clash.second} a port of its own: each protocol has its own listener in proxy_listener_mode separate.`,
    });
  }
  const servers: net.Server[] = [];
  try {
    for (const l of listeners) {
      const addr = p[l.key];
      if (!addr) continue;
      const guard = o.limits.listener(l.name, { sourceAtAccept: o.sourceAtAccept });
      const server = guardedServer(guard, (socket) => {
        o.streams.track(socket);
        l.onSocket(socket);
      });
      servers.push(server);
      o.named?.push({ name: l.name, server });
      o.addresses[l.name] = await listenOn(server, addr, `proxy_service.${l.key}`);
    }
  } catch (err) {
    await Promise.all(servers.map(closeServer));
    throw err;
  }
  return servers;
}

/**
 * Two of the listeners configured on one address (the same port, and the same host or a wildcard on either side),
 * found before anything binds: the second would fail with EADDRINUSE, which reads as "another process". Port 0
 * never clashes (each gets a free port).
 */
function sharedAddress(listeners: readonly Listener[], p: GatewayConfig['proxy_service']): { first: string; second: string; addr: string } | undefined {
  const wildcard = (host: string) => host === '0.0.0.0' || host === '::';
  const seen: Array<{ key: string; host: string; port: number }> = [];
  for (const l of listeners) {
    const addr = p[l.key];
    if (!addr || addr.port === 0) continue;
    const other = seen.find((s) => s.port === addr.port && (s.host === addr.host || wildcard(s.host) || wildcard(addr.host)));
    if (other) return { first: other.key, second: l.key, addr: formatHostPort(addr.host, addr.port) };
    seen.push({ key: l.key, host: addr.host, port: addr.port });
  }
  return undefined;
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
