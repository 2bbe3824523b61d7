/**
 * A preload (`NODE_OPTIONS=--require <this file>`) that makes a real Proxy daemon a compromised one, for the tests of
 * end-to-end streams (test/e2e/e2e-streams.test.ts): it sees what the Proxy's own code sees, nothing more, and does
 * what an attacker holding the Proxy's process could do with it.
 *
 *   GW_TEST_RECORD=<dir>         every chunk any socket of the process delivers to JavaScript is appended to a file
 *                                of that socket in the directory (NNNN-tls.bin: the plaintext of a TLS connection the
 *                                Proxy terminates, with the Proxy's own keys; NNNN-raw.bin: the bytes of a connection
 *                                it does not). That is everything the Proxy relays, as the Proxy holds it.
 *   GW_TEST_ALTER_AFTER=<n>      on a raw connection that is a client's end-to-end stream (its first bytes are the
 *                                stream line, "GWE2E1 "), the byte at offset n of what it received is flipped before
 *                                the Proxy's code sees it: the Proxy altering a relayed stream. (The line and the
 *                                ClientHello may arrive in one chunk or two: the line's magic is what names it.)
 *
 * It patches net.Socket.prototype.push (the one place a socket hands received bytes to JavaScript): a test-only
 * preload, never loaded by the product.
 */
'use strict';
const fs = require('node:fs');
const path = require('node:path');
const net = require('node:net');

const recordDir = process.env.GW_TEST_RECORD;
const alterAfter = process.env.GW_TEST_ALTER_AFTER ? Number(process.env.GW_TEST_ALTER_AFTER) : undefined;
const state = new WeakMap();
let sockets = 0;
const push = net.Socket.prototype.push;

net.Socket.prototype.push = function patchedPush(chunk, encoding) {
  if (Buffer.isBuffer(chunk) && chunk.length > 0) {
    let s = state.get(this);
    if (!s) {
      s = { n: ++sockets, received: 0, target: !this.encrypted && chunk.subarray(0, 7).toString('latin1') === 'GWE2E1 ' };
      state.set(this, s);
    }
    if (alterAfter !== undefined && s.target && s.received <= alterAfter && alterAfter < s.received + chunk.length) {
      chunk = Buffer.from(chunk);
      chunk[alterAfter - s.received] ^= 0x01;
    }
    s.received += chunk.length;
    if (recordDir) fs.appendFileSync(path.join(recordDir, `${String(s.n).padStart(4, '0')}-${this.encrypted ? 'tls' : 'raw'}.bin`), chunk);
  }
  return push.call(this, chunk, encoding);
};
