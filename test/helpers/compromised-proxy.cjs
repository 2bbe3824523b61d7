/**
 * A preload (`NODE_OPTIONS=--require <this file>`) that makes a real Proxy daemon a compromised one, for the tests of
 * end-to-end streams (test/e2e/e2e-streams.test.ts): it sees what the Proxy's own code sees, nothing more, and does
 * what an attacker holding the Proxy's process could do with it.
 *
 *   GW_TEST_RECORD=<file>        every chunk any socket of the process delivers is appended to the file: for a TLS
 *                                socket the Proxy terminates, the plaintext (its keys are the process's); for a raw
 *                                socket, the bytes as they came. That is everything the Proxy relays.
 *   GW_TEST_ALTER_AFTER=<bytes>  on every socket that is not TLS, the byte at that offset of what it received is
 *                                flipped before the Proxy's code sees it: the Proxy altering a relayed stream.
 *
 * It patches net.Socket.prototype.push (the one place a socket hands received bytes to JavaScript): a test-only
 * preload, never loaded by the product.
 */
'use strict';
const fs = require('node:fs');
const net = require('node:net');

const record = process.env.GW_TEST_RECORD;
const alterAfter = process.env.GW_TEST_ALTER_AFTER ? Number(process.env.GW_TEST_ALTER_AFTER) : undefined;
const received = new WeakMap();
const push = net.Socket.prototype.push;

net.Socket.prototype.push = function patchedPush(chunk, encoding) {
  if (Buffer.isBuffer(chunk) && chunk.length > 0) {
    if (alterAfter !== undefined && !this.encrypted) {
      const before = received.get(this) ?? 0;
      received.set(this, before + chunk.length);
      if (before <= alterAfter && alterAfter < before + chunk.length) {
        chunk = Buffer.from(chunk);
        chunk[alterAfter - before] ^= 0x01;
      }
    }
    if (record) fs.appendFileSync(record, chunk);
  }
  return push.call(this, chunk, encoding);
};
