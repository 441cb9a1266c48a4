// The ns-3 side of chakra-sim's `ns3` network: a point-to-point fabric built from the congestion
// plugin's link list, per-destination static routes, one TCP connection per (src, dst) pair that
// carries that pair's messages in order, and a byte counter at every sink. Compiled at run time by
// cppyy (cling) after the ns-3 headers are loaded; driven from model.py.
//
// Everything per packet stays in C++: Python sees one call per message sent and one per completed
// message, plus the co-simulation's RunUntil.

namespace chakra_ns3 {

using namespace ns3;

// A device queue that sends packets without payload (TCP ACKs, SYNs: at most kControlBytes on the
// wire) before data, FIFO within each class, as RDMA NICs and the HPCC/SimAI ns-3 fork (ACKs in
// the highest priority queue) do. Without it, a host's ACKs wait behind its own data and a
// window of one bandwidth-delay product no longer fills the link.
class AckFirstQueue : public Queue<Packet> {
  public:
    static const uint32_t kControlBytes = 120;

    static TypeId GetTypeId() {
        static TypeId tid = TypeId("chakra_ns3::AckFirstQueue")
                                .SetParent<Queue<Packet>>()
                                .SetGroupName("Network")
                                .AddConstructor<AckFirstQueue>();
        return tid;
    }

    bool Enqueue(Ptr<Packet> packet) override {
        if (packet->GetSize() <= kControlBytes) {
            auto position = GetContainer().begin();
            std::advance(position, m_control);
            if (!DoEnqueue(position, packet)) {
                return false;
            }
            ++m_control;
            return true;
        }
        return DoEnqueue(GetContainer().end(), packet);
    }

    Ptr<Packet> Dequeue() override {
        Ptr<Packet> packet = DoDequeue(GetContainer().begin());
        if (packet && m_control) {
            --m_control;
        }
        return packet;
    }

    Ptr<Packet> Remove() override {
        Ptr<Packet> packet = DoRemove(GetContainer().begin());
        if (packet && m_control) {
            --m_control;
        }
        return packet;
    }

    Ptr<const Packet> Peek() const override {
        return DoPeek(GetContainer().begin());
    }

  private:
    uint32_t m_control = 0;     // control packets at the head of the queue
};

struct Message {
    uint64_t id;
    uint64_t end;     // the message's last byte, as an offset in its connection's byte stream
};

struct Connection {
    uint32_t src = 0, dst = 0;
    Ptr<Socket> socket;          // the sender's socket
    bool connected = false;
    uint64_t queued = 0;         // bytes the engine handed to this connection
    uint64_t pushed = 0;         // bytes given to the socket
    uint64_t received = 0;       // bytes the sink has read
    std::deque<Message> messages;
};

class Fabric {
  public:
    Fabric(uint32_t devices, bool ack_first) : m_ackFirst(ack_first) {
        m_nodes.Create(devices);
    }

    // Links: a pair of directed links (a -> b with rate ab, b -> a with rate ba) is one
    // point-to-point channel; `delay_ns` is the one-way latency of both directions.
    void AddLinkPair(uint32_t ab, uint32_t ba, uint32_t a, uint32_t b, uint64_t bps_ab, uint64_t bps_ba,
                     int64_t delay_ns, uint32_t mtu, uint32_t queue_packets) {
        PointToPointHelper p2p;
        p2p.SetDeviceAttribute("DataRate", DataRateValue(DataRate(bps_ab)));
        p2p.SetDeviceAttribute("Mtu", UintegerValue(mtu));
        p2p.SetChannelAttribute("Delay", TimeValue(NanoSeconds(delay_ns)));
        NetDeviceContainer pair = p2p.Install(m_nodes.Get(a), m_nodes.Get(b));
        DynamicCast<PointToPointNetDevice>(pair.Get(1))->SetDataRate(DataRate(bps_ba));
        for (uint32_t end = 0; end < 2; ++end) {
            Ptr<Queue<Packet>> queue;
            if (m_ackFirst) {
                queue = CreateObject<AckFirstQueue>();
            } else {
                queue = CreateObject<DropTailQueue<Packet>>();
            }
            queue->SetMaxSize(QueueSize(QueueSizeUnit::PACKETS, queue_packets));
            DynamicCast<PointToPointNetDevice>(pair.Get(end))->SetQueue(queue);
        }
        uint32_t needed = std::max(ab, ba) + 1;
        if (m_devices.size() < needed) {
            m_devices.resize(needed);
        }
        m_devices[ab] = DynamicCast<PointToPointNetDevice>(pair.Get(0));
        m_devices[ba] = DynamicCast<PointToPointNetDevice>(pair.Get(1));
        m_pairs.Add(pair);
    }

    // The IP stack (static routing only), one /30 per channel, no queue discs (packets go straight
    // to the device queues), statistics on every device.
    void InstallStack(uint32_t hosts) {
        InternetStackHelper stack;
        stack.SetIpv6StackInstall(false);
        Ipv4StaticRoutingHelper staticRouting;
        stack.SetRoutingHelper(staticRouting);
        stack.Install(m_nodes);
        Ipv4AddressGenerator::Reset();
        Ipv4AddressHelper address;
        address.SetBase("10.0.0.0", "255.255.255.252");
        for (uint32_t i = 0; i < m_pairs.GetN(); i += 2) {
            NetDeviceContainer pair;
            pair.Add(m_pairs.Get(i));
            pair.Add(m_pairs.Get(i + 1));
            address.Assign(pair);
            address.NewNetwork();
        }
        TrafficControlHelper tc;
        tc.Uninstall(m_pairs);
        m_hostAddress.resize(hosts);
        for (uint32_t h = 0; h < hosts; ++h) {
            Ptr<Ipv4> ip = m_nodes.Get(h)->GetObject<Ipv4>();
            m_hostAddress[h] = ip->GetAddress(1, 0).GetLocal();   // interface 0 is the loopback
        }
        uint32_t links = m_devices.size();
        m_payload.assign(links, 0);
        m_wire.assign(links, 0);
        m_packets.assign(links, 0);
        m_peakPackets.assign(links, 0);
        m_peakBytes.assign(links, 0);
        for (uint32_t link = 0; link < links; ++link) {
            Ptr<PointToPointNetDevice> device = m_devices[link];
            if (!device) {
                continue;
            }
            device->TraceConnectWithoutContext("PhyTxBegin", MakeBoundCallback(&Fabric::OnTx, this, link));
            device->GetQueue()->TraceConnectWithoutContext("PacketsInQueue",
                                                           MakeBoundCallback(&Fabric::OnQueuePackets, this, link));
            device->GetQueue()->TraceConnectWithoutContext("BytesInQueue",
                                                           MakeBoundCallback(&Fabric::OnQueueBytes, this, link));
        }
        m_listeners.resize(hosts);
        for (uint32_t h = 0; h < hosts; ++h) {
            Ptr<Socket> listener = Socket::CreateSocket(m_nodes.Get(h), TcpSocketFactory::GetTypeId());
            listener->Bind(InetSocketAddress(Ipv4Address::GetAny(), kPort));
            listener->Listen();
            listener->SetAcceptCallback(MakeNullCallback<bool, Ptr<Socket>, const Address&>(),
                                        MakeCallback(&Fabric::OnAccept, this));
            m_listeners[h] = listener;
        }
    }

    // Routes: at `device`, packets for host `dst` leave by directed link `link`.
    void AddRoutes(const std::vector<uint32_t>& device, const std::vector<uint32_t>& dst,
                   const std::vector<uint32_t>& link) {
        Ipv4StaticRoutingHelper helper;
        for (size_t i = 0; i < device.size(); ++i) {
            Ptr<Node> node = m_nodes.Get(device[i]);
            Ptr<Ipv4> ip = node->GetObject<Ipv4>();
            int32_t interface = ip->GetInterfaceForDevice(m_devices[link[i]]);
            helper.GetStaticRouting(ip)->AddHostRouteTo(m_hostAddress[dst[i]], interface);
        }
    }

    // A message of `size` bytes (> 0) from host src to host dst, entering the network at `at_ns`
    // (not before ns-3's now).
    void Send(uint32_t src, uint32_t dst, uint64_t size, uint64_t id, int64_t at_ns) {
        Time delay = NanoSeconds(at_ns) - Simulator::Now();
        if (delay.IsStrictlyNegative()) {
            delay = Seconds(0);
        }
        Simulator::ScheduleWithContext(src, delay, &Fabric::Start, this, src, dst, size, id);
    }

    // Run ns-3 until `until_ns`, or until the first message completes (it stops the simulator
    // at its completion time); return ns-3's time.
    int64_t RunUntil(int64_t until_ns) {
        m_stop.Cancel();
        Time delay = NanoSeconds(until_ns) - Simulator::Now();
        m_stop = Simulator::Stop(delay.IsStrictlyNegative() ? Seconds(0) : delay);
        Simulator::Run();
        return Simulator::Now().GetNanoSeconds();
    }

    int64_t Now() const { return Simulator::Now().GetNanoSeconds(); }
    size_t DoneCount() const { return m_done.size(); }
    uint64_t DoneId(size_t i) const { return m_done[i].first; }
    int64_t DoneTime(size_t i) const { return m_done[i].second; }
    void ClearDone() { m_done.clear(); }
    size_t Connections() const { return m_connections.size(); }
    uint64_t Payload(uint32_t link) const { return m_payload[link]; }
    uint64_t Wire(uint32_t link) const { return m_wire[link]; }
    uint64_t Packets(uint32_t link) const { return m_packets[link]; }
    uint32_t PeakPackets(uint32_t link) const { return m_peakPackets[link]; }
    uint32_t PeakBytes(uint32_t link) const { return m_peakBytes[link]; }
    bool HasDevice(uint32_t link) const { return link < m_devices.size() && m_devices[link]; }

    uint64_t Drops() const {
        uint64_t drops = 0;
        for (const auto& device : m_devices) {
            if (device) {
                drops += device->GetQueue()->GetTotalDroppedPackets();
            }
        }
        return drops;
    }

  private:
    static const uint16_t kPort = 9000;

    void Start(uint32_t src, uint32_t dst, uint64_t size, uint64_t id) {
        uint64_t key = (uint64_t(src) << 32) | dst;
        auto found = m_byPair.find(key);
        Connection* c;
        if (found == m_byPair.end()) {
            m_connections.emplace_back(new Connection());
            c = m_connections.back().get();
            c->src = src;
            c->dst = dst;
            m_byPair[key] = c;
            Ptr<Socket> socket = Socket::CreateSocket(m_nodes.Get(src), TcpSocketFactory::GetTypeId());
            socket->Bind(InetSocketAddress(m_hostAddress[src], 0));
            Address local;
            socket->GetSockName(local);
            uint16_t port = InetSocketAddress::ConvertFrom(local).GetPort();
            m_byPeer[(uint64_t(m_hostAddress[src].Get()) << 16) | port] = c;
            m_bySocket[PeekPointer(socket)] = c;
            c->socket = socket;
            socket->SetConnectCallback(MakeCallback(&Fabric::OnConnected, this),
                                       MakeCallback(&Fabric::OnConnectFailed, this));
            socket->SetSendCallback(MakeCallback(&Fabric::OnSendable, this));
            socket->Connect(InetSocketAddress(m_hostAddress[dst], kPort));
        } else {
            c = found->second;
        }
        c->queued += size;
        c->messages.push_back(Message{id, c->queued});
        Push(c);
    }

    void Push(Connection* c) {
        if (!c->connected) {
            return;
        }
        while (c->pushed < c->queued) {
            uint32_t room = c->socket->GetTxAvailable();
            if (room == 0) {
                return;
            }
            uint64_t n = std::min<uint64_t>(room, c->queued - c->pushed);
            int sent = c->socket->Send(Create<Packet>(uint32_t(n)));
            if (sent <= 0) {
                return;
            }
            c->pushed += uint64_t(sent);
        }
    }

    void OnConnected(Ptr<Socket> socket) {
        Connection* c = m_bySocket[PeekPointer(socket)];
        c->connected = true;
        Push(c);
    }

    void OnConnectFailed(Ptr<Socket> socket) {
        NS_FATAL_ERROR("chakra-sim ns3: a TCP connection failed");
    }

    void OnSendable(Ptr<Socket> socket, uint32_t) {
        Push(m_bySocket[PeekPointer(socket)]);
    }

    void OnAccept(Ptr<Socket> socket, const Address& from) {
        InetSocketAddress peer = InetSocketAddress::ConvertFrom(from);
        auto found = m_byPeer.find((uint64_t(peer.GetIpv4().Get()) << 16) | peer.GetPort());
        NS_ABORT_MSG_IF(found == m_byPeer.end(), "chakra-sim ns3: a connection from an unknown peer");
        m_bySink[PeekPointer(socket)] = found->second;
        socket->SetRecvCallback(MakeCallback(&Fabric::OnReceive, this));
    }

    void OnReceive(Ptr<Socket> socket) {
        Connection* c = m_bySink[PeekPointer(socket)];
        Ptr<Packet> packet;
        while ((packet = socket->Recv())) {
            if (packet->GetSize() == 0) {
                break;
            }
            c->received += packet->GetSize();
        }
        bool completed = false;
        while (!c->messages.empty() && c->messages.front().end <= c->received) {
            m_done.emplace_back(c->messages.front().id, Simulator::Now().GetNanoSeconds());
            c->messages.pop_front();
            completed = true;
        }
        if (completed) {
            Simulator::Stop();     // hand the completion to the engine at this very time
        }
    }

    static void OnTx(Fabric* self, uint32_t link, Ptr<const Packet> packet) {
        self->m_wire[link] += packet->GetSize();
        self->m_packets[link] += 1;
        Ptr<Packet> copy = packet->Copy();
        PppHeader ppp;
        copy->RemoveHeader(ppp);
        Ipv4Header ip;
        copy->RemoveHeader(ip);
        if (ip.GetProtocol() == 6) {
            TcpHeader tcp;
            copy->RemoveHeader(tcp);
            self->m_payload[link] += copy->GetSize();
        }
    }

    static void OnQueuePackets(Fabric* self, uint32_t link, uint32_t, uint32_t now) {
        if (now > self->m_peakPackets[link]) {
            self->m_peakPackets[link] = now;
        }
    }

    static void OnQueueBytes(Fabric* self, uint32_t link, uint32_t, uint32_t now) {
        if (now > self->m_peakBytes[link]) {
            self->m_peakBytes[link] = now;
        }
    }

    NodeContainer m_nodes;
    NetDeviceContainer m_pairs;
    std::vector<Ptr<PointToPointNetDevice>> m_devices;   // by the congestion plugin's link id
    std::vector<Ipv4Address> m_hostAddress;
    std::vector<Ptr<Socket>> m_listeners;
    std::vector<std::unique_ptr<Connection>> m_connections;
    std::unordered_map<uint64_t, Connection*> m_byPair, m_byPeer;
    std::unordered_map<Socket*, Connection*> m_bySocket, m_bySink;
    std::vector<std::pair<uint64_t, int64_t>> m_done;
    std::vector<uint64_t> m_payload, m_wire, m_packets;
    std::vector<uint32_t> m_peakPackets, m_peakBytes;
    EventId m_stop;
    bool m_ackFirst;
};

// TCP set up as a window-limited, loss-free transport (see the plugin's README).
void ConfigureTcp(uint32_t segment, uint32_t window, uint32_t seed) {
    RngSeedManager::SetSeed(seed);
    RngSeedManager::SetRun(1);
    Config::SetDefault("ns3::TcpL4Protocol::SocketType", TypeIdValue(TcpNewReno::GetTypeId()));
    Config::SetDefault("ns3::TcpSocket::SegmentSize", UintegerValue(segment));
    Config::SetDefault("ns3::TcpSocket::RcvBufSize", UintegerValue(window));
    Config::SetDefault("ns3::TcpSocket::SndBufSize", UintegerValue(2 * window));
    Config::SetDefault("ns3::TcpSocket::InitialCwnd", UintegerValue((window + segment - 1) / segment));
    Config::SetDefault("ns3::TcpSocketBase::Timestamp", BooleanValue(false));
}

void Reset() {
    Simulator::Destroy();
}

}  // namespace chakra_ns3
