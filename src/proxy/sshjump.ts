/**
 * The Proxy's SSH entry for plain SSH clients: a jump host (OpenSSH's ProxyJump / `ssh -J`) on
 * proxy_service.listen_addr (3023) with separate listeners, and for raw SSH sniffed on the one TLS port.
 *
 * The client authenticates with its user certificate from this cluster (any user name: the login that matters
 * is the one the node is asked for, inside). It then asks for a direct-tcpip channel to "<node>:<port>"; the
 * Proxy finds the node among the agents it reaches (router.ts; by name or host ID), checks the user's current roles allow its
 * labels, and carries the channel to the node's SSH Service through the agent's tunnel (or a peer's). The node checks the
 * login against the certificate's principals, as always. The user must still exist and not be locked
 * (AuthService.resolveSshUser), and the connection is tracked in auth.sessions: a lock or a deletion ends it.
 */
import type { Duplex } from 'node:stream';
import type { Connection } from 'ssh2';
import { CLOCK_SKEW_MS } from '../auth/pki.js';
import { canAccess } from '../auth/rbac.js';
import type { ProxyAuth } from '../auth/proxyauth.js';
import { checkUserCertAuth } from '../auth/sshauth.js';
import { logger } from '../log.js';
import { clientOf, type ConnInfo } from '../mux/multiplexer.js';
import { SshEndpoint, type SshDeadlines } from '../net/ssh.js';
import { relayChannel } from '../net/sshchannel.js';
import { splice } from '../stream/splice.js';
import { startHop, traceFields, withinHop } from '../trace.js';
import type { AgentSource } from './router.js';
import { findTarget } from './resources.js';

export class SshJumpServer {
  private readonly endpoint: SshEndpoint<string>;
  private readonly log = logger('ssh-jump');

  constructor(
    private readonly auth: ProxyAuth,
    private readonly agents: AgentSource,
    hostKeyPem: string,
    deadlines: SshDeadlines = { sshHandshakeMs: 30_000, idleMs: 300_000 },
  ) {
    this.endpoint = new SshEndpoint({ hostKeys: [hostKeyPem], ident: 'gateway-proxy', deadlines, onConnection: (conn, client) => this.onConnection(conn, client ?? 'unknown') });
  }

  handle = (stream: Duplex, info: ConnInfo): void => {
    this.endpoint.inject(stream, clientOf(info));
  };

  private onConnection(conn: Connection, client: string): void {
    let user = '';
    let issuedAt: number | undefined;
    conn.on('authentication', (ctx) => {
      if (ctx.method !== 'publickey') return ctx.reject(['publickey']);
      const check = checkUserCertAuth(ctx, this.auth.user.ssh.publicKey, Date.now());
      if (!check.ok) {
        this.log.info({ client, why: check.why }, 'SSH jump refused');
        return ctx.reject(['publickey']);
      }
      if (!check.query) {
        user = check.cert.keyId;
        issuedAt = check.cert.validAfter + CLOCK_SKEW_MS;
      }
      ctx.accept();
    });
    conn.on('ready', () => {
      const identity = { kind: 'user' as const, name: user, cluster: this.auth.clusterName, roles: [], ...(issuedAt === undefined ? {} : { issuedAt }) };
      const untrack = this.auth.sessions.track(identity, `ssh jump ${client}`, () => conn.end());
      conn.once('close', untrack);
      conn.on('session', (_accept, reject) => reject());
      conn.on('tcpip', (accept, reject, dest) => {
        void (async () => {
          const node = dest.destIP;
          const target = findTarget(this.agents.agents(), 'ssh', { resource: node });
          if (!target) {
            this.log.info({ user, node, client }, 'SSH jump: no connected node by that name');
            return reject();
          }
          const current = await this.auth.resolveSshUser(user, issuedAt);
          if (!canAccess(await this.auth.rolesOf(current.roles), target.access, target.labels)) {
            this.log.info({ user, node, client }, 'SSH jump: the user’s roles do not allow this node');
            return reject();
          }
          // SSH carries no trace context: each channel starts a trace here (sampled by the Proxy's ratio).
          const hop = startHop('proxy.ssh_jump', {
            kind: 'server',
            attributes: { 'gateway.route': 'ssh-jump', 'gateway.route.reason': 'SSH direct-tcpip channel to a node', 'gateway.service': 'ssh', 'gateway.resource': target.agent.nodename, 'gateway.agent.host_id': target.agent.hostId },
          });
          const channel = await withinHop(hop, () =>
            this.agents.dial(target.agent.hostId, {
              service: 'ssh',
              resource: `@${target.agent.nodename}`,
              client_src: client,
              client_dst: `${dest.destIP}:${dest.destPort}`,
              user,
              ...traceFields(hop.context),
            }),
          );
          const accepted = relayChannel(accept());
          this.endpoint.channelOpened(conn, accepted);
          splice(accepted as unknown as Duplex, channel);
        })().catch((err: unknown) => {
          this.log.info({ user, node: dest.destIP, err: (err as Error).message }, 'SSH jump failed');
          reject();
        });
      });
    });
    conn.on('error', () => undefined);
  }
}
