/**
 * Connection upgrades through HTTP apps: a WebSocket (or any `Upgrade` the app answers with 101) on an app's public
 * address is passed to the app and, once the app switched protocols, spliced both ways until either side ends.
 *
 * The request gets exactly the checks of an app request (webapps.ts appCaller and openApp): the user's
 * certificate or the Web UI's app session, the roles' app_labels, the user as it stands now; the upgraded
 * connection is tracked in auth.sessions for as long as it is open, so a lock or a removed user closes it at once,
 * and it counts its bytes in the same audited app session as the app's other requests.
 *
 * The relay itself (deadlines, the 101's protocol check, refusals relayed, the splice) is src/net/upgrade.ts,
 * shared with the Kubernetes route and the agent's Kubernetes front: this file adds what is the app's. Codes: no
 * answer within header_timeout GW_ERR_APP_UPGRADE_TIMEOUT; a 101 to another protocol than the one asked for
 * GW_ERR_APP_UPGRADE_UNASKED; the upgraded connection closes after idle_timeout without bytes either way.
 * The relay of plain app requests (webapps.ts relay) refuses a 101 to a request that did not ask for one.
 */
import http from 'node:http';
import type { Duplex } from 'node:stream';
import type { ProxyAuth } from '../auth/proxyauth.js';
import { appSessionKey } from './webcredentials.js';
import { toGatewayError } from '../errors.js';
import { logger } from '../log.js';
import type { HttpDeadlines } from '../net/http.js';
import { protocolsOf, relayed, relayUpgrade } from '../net/upgrade.js';
import type { AgentSource } from './router.js';
import { findWebApp } from './resources.js';
import type { SessionAudit } from './sessionaudit.js';
import { refuseUpgrade } from './webanswer.js';
import { appCaller, gatewayCookie, openApp, withoutGatewayCookies } from './webapps.js';

export interface AppUpgradeOptions {
  /** headerMs: the time the app has to answer the upgrade; idleMs: how long the upgraded connection may be silent. */
  deadlines: Pick<HttpDeadlines, 'headerMs' | 'idleMs'>;
  audit?: SessionAudit;
}

/**
 * Returns the web port's upgrade handler for HTTP apps: false when the request's Host is not an app's public
 * address (the Proxy's own upgrade routes then take it), else the upgrade is the app's, and refused or relayed.
 */
export function createWebAppUpgradeHandler(auth: ProxyAuth, agents: AgentSource, options: AppUpgradeOptions): (req: http.IncomingMessage, socket: Duplex, head: Buffer) => boolean {
  const log = logger('webapps');
  return (req, socket, head) => {
    const host = (req.headers.host ?? '').toLowerCase().replace(/:\d+$/, '');
    const target = host ? findWebApp(agents.agents(), host) : undefined;
    if (!target) return false;
    socket.on('error', () => socket.destroy());
    void (async () => {
      const asked = protocolsOf(req.headers.upgrade);
      const key = appSessionKey(target.name, host);
      const track = (who: Parameters<ProxyAuth['sessions']['track']>[0], what: string) => {
        const untrack = auth.sessions.track(who, `${what} (upgraded)`, () => socket.destroy());
        socket.once('close', untrack);
        if (socket.destroyed) untrack();
      };
      const { identity, appSession } = await appCaller(auth, target.name, key, req, track, options.audit);
      const { stream, meter, client } = await openApp(auth, agents, target, identity, req, appSession, options.audit);
      if (socket.destroyed) return void stream.destroy();
      log.info({ user: identity.name, app: target.name, path: req.url, upgrade: asked.join(',') }, 'app upgrade request');
      withoutGatewayCookies(req);
      const headers: http.OutgoingHttpHeaders = {};
      for (const [k, v] of Object.entries(req.headers)) if (relayed(k) && v !== undefined) headers[k] = v;
      Object.assign(headers, { connection: 'Upgrade', upgrade: req.headers.upgrade, 'x-forwarded-for': client.address, 'x-forwarded-proto': 'https', 'x-forwarded-host': req.headers.host ?? host, 'x-gateway-user': identity.name });
      const upstream = http.request({ method: req.method, path: req.url ?? '/', headers, createConnection: () => stream as never });
      // A Web UI app session is ended after 10 idle minutes without requests: its upgraded connections keep it on.
      const touch = appSession && options.audit ? () => options.audit?.touchHttp(`app:${appSession}`) : undefined;
      await relayUpgrade(upstream, socket, head, asked, {
        ...options.deadlines,
        peer: 'the app',
        codes: { timeout: 'GW_ERR_APP_UPGRADE_TIMEOUT', unasked: 'GW_ERR_APP_UPGRADE_UNASKED' },
        dropCookie: gatewayCookie,
        ...(meter ? { meter } : {}),
        ...(touch ? { touch } : {}),
      });
      log.info({ user: identity.name, app: target.name, upgrade: asked.join(',') }, 'app connection upgraded');
    })().catch((err: unknown) => {
      const e = toGatewayError(err);
      log.info({ app: target.name, code: e.code, err: e.message }, 'app upgrade refused');
      refuseUpgrade(socket, e);
    });
    return true;
  };
}
