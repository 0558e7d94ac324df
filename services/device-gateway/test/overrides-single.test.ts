// Overrides in the open on one gateway without the replica bus (GATEWAY_CLUSTER_BUS=false; design §3.3): the list is
// this process's overrides, the clear ends one here, and a CoAP observer gets the next layer as a higher version.
import request from 'supertest';
import { json, RawCoapClient } from './support/coap-client.js';
import { API_KEYS, startGateway, type GatewayFixture } from './support/gateway.js';

const key = `Bearer ${API_KEYS[0]!}`;
const HVAC = 'acme-hq-hvac-01';

describe('overrides without the replica bus', () => {
  let gw: GatewayFixture;
  let observer: RawCoapClient;

  beforeAll(async () => {
    gw = await startGateway();
    observer = await RawCoapClient.observeSettings(gw.coapPort, HVAC);
  });

  afterAll(async () => {
    await observer.close();
    await gw.close();
  });

  it('lists, pages and clears this process’s overrides', async () => {
    for (const [id, s] of [
      [HVAC, 70],
      ['acme-hq-lobby-sensor-03', 71],
    ] as const) {
      const res = await request(gw.app.http)
        .post('/api/notify-settings')
        .set('Authorization', key)
        .send({ device_id: id, settings: { reporting_interval_s: s } });
      expect(res.status).toBe(200);
    }
    const overridden = json(
      (await observer.waitFor((p) => p.code === '2.05' && json(p).source === 'override')).packet,
    ) as { version: number };
    const first = await request(gw.app.http).get('/api/overrides?limit=1').set('Authorization', key);
    expect(first.status).toBe(200);
    expect(first.body).toMatchObject({
      items: [
        {
          device_id: HVAC,
          settings: { reporting_interval_s: 70 },
          version: overridden.version,
          origin: null,
          set_at: null,
          hides: [{ source: 'registry' }],
        },
      ],
    });
    const second = await request(gw.app.http)
      .get(`/api/overrides?limit=1&cursor=${String(first.body.next_cursor)}`)
      .set('Authorization', key);
    expect(second.body).toMatchObject({
      items: [{ device_id: 'acme-hq-lobby-sensor-03' }],
      next_cursor: null,
    });

    const from = observer.inbox.length;
    const cleared = await request(gw.app.http)
      .delete(`/api/devices/${HVAC}/override`)
      .set('Authorization', key);
    expect(cleared.body).toMatchObject({ device_id: HVAC, cleared: true, settings: { source: 'registry' } });
    const back = json((await observer.waitFor((p) => p.code === '2.05', 3000, from)).packet) as {
      version: number;
      source: string;
    };
    expect(back.source).toBe('registry');
    expect(back.version).toBeGreaterThan(overridden.version);
    const view = await request(gw.app.http).get(`/api/devices/${HVAC}`).set('Authorization', key);
    expect(view.body.settings_layers).toMatchObject({
      effective: 'registry',
      layers: [{ source: 'registry', effective: true }],
    });
    const list = await request(gw.app.http).get('/api/overrides').set('Authorization', key);
    expect(list.body.items).toMatchObject([{ device_id: 'acme-hq-lobby-sensor-03' }]);
  });
});
