// Engine: the delayed-scaling states it owns (created on a plugin's request, moved between
// devices, read and written for checkpoints, and updated once per step on the CPU or by one
// CUDA launch per device, scaling/scaling_cuda.cu).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <string>
#include <sstream>
#include <vector>

#include "qrecipe/cuda.hpp"
#include "qrecipe/engine.hpp"
#include "qrecipe/scaling.hpp"
#include "scaling/scaling_cuda.hpp"

namespace qrecipe {

namespace {

std::string request_str(const qr_scaling_request& r) {
  std::ostringstream os;
  os << "amax_history_len " << r.history_len << ", amax_compute_algo "
     << (r.algo_most_recent ? "most_recent" : "max") << ", margin " << r.margin << ", fp8 max "
     << r.fp8_max;
  return os.str();
}

bool same_settings(const qr_scaling_request& a, const qr_scaling_request& b) {
  return a.history_len == b.history_len && a.algo_most_recent == b.algo_most_recent &&
         a.margin == b.margin && a.fp8_max == b.fp8_max;
}

// The values of one state, through the host (CUDA states: synchronous copies).
Engine::ScalingValues read_values(const ScalingState& s) {
  Engine::ScalingValues v;
  const auto n = static_cast<std::size_t>(s.c.history_len);
  v.amax_history.resize(n);
  if (s.c.device.type == QR_DEVICE_CPU) {
    std::copy(s.c.amax_history, s.c.amax_history + n, v.amax_history.begin());
    v.scale = *s.c.scale;
    v.scale_inv = *s.c.scale_inv;
  } else {
    copy_to_host(v.amax_history.data(), s.c.amax_history, n * sizeof(float));
    copy_to_host(&v.scale, s.c.scale, sizeof(float));
    copy_to_host(&v.scale_inv, s.c.scale_inv, sizeof(float));
  }
  return v;
}

// In place: quantizers hold these pointers.
void write_values(ScalingState& s, const Engine::ScalingValues& values) {
  const auto n = static_cast<std::size_t>(s.c.history_len);
  if (s.c.device.type == QR_DEVICE_CPU) {
    std::copy(values.amax_history.begin(), values.amax_history.end(), s.c.amax_history);
    *s.c.scale = values.scale;
    *s.c.scale_inv = values.scale_inv;
  } else {
    copy_to_device(s.c.amax_history, values.amax_history.data(), n * sizeof(float));
    copy_to_device(s.c.scale, &values.scale, sizeof(float));
    copy_to_device(s.c.scale_inv, &values.scale_inv, sizeof(float));
  }
}

float row0_of(const ScalingState& s) {
  float row0 = 0.0f;
  if (s.c.device.type == QR_DEVICE_CPU)
    row0 = s.c.amax_history[0];
  else
    copy_to_host(&row0, s.c.amax_history, sizeof row0);
  return row0;
}

}  // namespace

qr_scaling_state Engine::acquire_scaling_state(const qr_scaling_request& request,
                                               const std::string& owner,
                                               const std::string& share) {
  QR_CHECK(request.history_len >= 1, "delayed scaling needs amax_history_len >= 1, got ",
           request.history_len);
  QR_CHECK(request.fp8_max > 0.0f, "delayed scaling needs a positive fp8_max, got ",
           request.fp8_max);
  const Device device = Device::from_c(request.device);
  QR_CHECK_CODE(device.is_cpu() || device.is_cuda(), QR_STATUS_UNSUPPORTED,
                "delayed-scaling state requested on unknown device type ", request.device.type,
                " by ", owner, "; expected cpu or cuda");
  // CUDA states come from the CUDA allocator (throws UNSUPPORTED in a build without CUDA).
  const std::shared_ptr<Allocator> allocator = device.is_cpu() ? allocator_ : cuda_allocator();
  std::lock_guard<std::mutex> lock(mutex_);
  const ScalingState* group_first = nullptr;
  if (!share.empty()) {
    if (auto it = share_groups_.find(share); it != share_groups_.end()) {
      group_first = states_[it->second.front()].get();
      QR_CHECK(same_settings(group_first->request, request), "the delayed-scaling state shared as '",
               share, "' was made by ", group_first->owner, " with ",
               request_str(group_first->request), ", but ", owner, " asks for it with ",
               request_str(request), "; roles that share a state need the same delayed-scaling "
               "settings and FP8 dtype (or another share name)");
    }
  }
  note_state_acquired();
  auto s = std::make_unique<ScalingState>();
  s->request = request;
  s->owner = owner;
  s->share = share;
  const auto n = static_cast<std::size_t>(request.history_len);
  s->history = Buffer(allocator, n * sizeof(float), device);  // zero-filled
  s->scale = Buffer(allocator, sizeof(float), device);
  s->scale_inv = Buffer(allocator, sizeof(float), device);
  const float one = 1.0f;  // a new state: history zeros, scale 1.0 (docs/numerics.md)
  if (device.is_cpu()) {
    *static_cast<float*>(s->scale.data()) = one;
    *static_cast<float*>(s->scale_inv.data()) = one;
  } else {
    copy_to_device(s->scale.data(), &one, sizeof one);
    copy_to_device(s->scale_inv.data(), &one, sizeof one);
  }
  s->c.struct_size = sizeof(qr_scaling_state);
  s->c.amax_history = static_cast<float*>(s->history.data());
  s->c.scale = static_cast<float*>(s->scale.data());
  s->c.scale_inv = static_cast<float*>(s->scale_inv.data());
  s->c.history_len = request.history_len;
  s->c.device = request.device;
  if (group_first != nullptr) {
    // A late member starts where the group is: its history and scale, and a row 0 of its own.
    ScalingValues v = read_values(*group_first);
    v.amax_history[0] = 0.0f;
    write_values(*s, v);
  }
  states_.push_back(std::move(s));
  if (!share.empty()) {
    share_groups_[share].push_back(states_.size() - 1);
    group_name_[states_.size() - 1] = share;
  }
  ++states_version_;
  return states_.back()->c;
}

std::vector<std::size_t> Engine::group_of(std::size_t index) const {
  if (auto it = group_name_.find(index); it != group_name_.end())
    return share_groups_.at(it->second);
  return {index};
}

std::vector<std::size_t> Engine::with_groups(const std::vector<std::size_t>& indices) const {
  std::vector<std::size_t> out;
  for (std::size_t i : indices)
    for (std::size_t member : group_of(i)) out.push_back(member);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

qr_scaling_state Engine::move_scaling_state(const float* amax_history, const qr_device& device) {
  std::lock_guard<std::mutex> lock(mutex_);
  ScalingState* s = nullptr;
  for (const auto& state : states_)
    if (state->c.amax_history == amax_history) s = state.get();
  QR_CHECK(s != nullptr, "move_scaling_state: no scaling state of this engine has its amax "
           "history at ", static_cast<const void*>(amax_history),
           "; pass the state this engine's scaling_state_acquire returned");
  const Device from = Device::from_c(s->c.device), to = Device::from_c(device);
  QR_CHECK_CODE(to.is_cpu() || to.is_cuda(), QR_STATUS_UNSUPPORTED,
                "delayed-scaling state of ", s->owner, " cannot move to device type ",
                device.type, "; expected cpu or cuda");
  if (from == to) return s->c;
  // The values, through the host: history, then scale, scale_inv.
  const auto n = static_cast<std::size_t>(s->c.history_len);
  std::vector<float> values(n + 2);
  if (from.is_cpu()) {
    std::copy(s->c.amax_history, s->c.amax_history + n, values.begin());
    values[n] = *s->c.scale;
    values[n + 1] = *s->c.scale_inv;
  } else {
    copy_to_host(values.data(), s->c.amax_history, n * sizeof(float));
    copy_to_host(&values[n], s->c.scale, sizeof(float));
    copy_to_host(&values[n + 1], s->c.scale_inv, sizeof(float));
  }
  const std::shared_ptr<Allocator> allocator = to.is_cpu() ? allocator_ : cuda_allocator();
  Buffer history(allocator, n * sizeof(float), to);
  Buffer scale(allocator, sizeof(float), to);
  Buffer scale_inv(allocator, sizeof(float), to);
  if (to.is_cpu()) {
    std::copy(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(n),
              static_cast<float*>(history.data()));
    *static_cast<float*>(scale.data()) = values[n];
    *static_cast<float*>(scale_inv.data()) = values[n + 1];
  } else {
    copy_to_device(history.data(), values.data(), n * sizeof(float));
    copy_to_device(scale.data(), &values[n], sizeof(float));
    copy_to_device(scale_inv.data(), &values[n + 1], sizeof(float));
  }
  s->history = std::move(history);
  s->scale = std::move(scale);
  s->scale_inv = std::move(scale_inv);
  s->c.amax_history = static_cast<float*>(s->history.data());
  s->c.scale = static_cast<float*>(s->scale.data());
  s->c.scale_inv = static_cast<float*>(s->scale_inv.data());
  s->c.device = device;
  s->request.device = device;
  ++states_version_;
  return s->c;
}

std::vector<float> Engine::current_amaxes() const {
  std::vector<float> out;
  out.reserve(states_.size());
  for (const auto& s : states_) out.push_back(row0_of(*s));
  return out;
}

Engine::ScalingValues Engine::scaling_values(std::size_t index) const {
  QR_CHECK(index < states_.size(), "scaling state ", index, " does not exist; this engine has ",
           states_.size());
  ScalingValues v = read_values(*states_[index]);
  // A shared state's row 0 is the group's: the max over its members.
  for (std::size_t member : group_of(index))
    if (member != index) v.amax_history[0] = std::fmax(v.amax_history[0], row0_of(*states_[member]));
  return v;
}

namespace {
// Shortest text that reads back as the same float ("0.33333334", "nan", "-2").
std::string float_str(float v) {
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, v);
  return std::string(buffer, result.ptr);
}
}  // namespace

void Engine::check_scaling_values(std::size_t index, const ScalingValues& values) const {
  QR_CHECK(index < states_.size(), "scaling state ", index, " does not exist; this engine has ",
           states_.size());
  const ScalingState& s = *states_[index];
  const auto n = static_cast<std::size_t>(s.c.history_len);
  QR_CHECK(values.amax_history.size() == n, "scaling state of ", s.owner,
           " has an amax history of ", n, " steps, the values to load have ",
           values.amax_history.size(), "; load a checkpoint made with the same amax_history_len");
  const std::string who = "scaling state of '" + s.owner + "'";
  const char* corrupt = "; the checkpoint is corrupt (load it without its scaling state, "
                        "qrecipe.drop_scaling_states in Python, to start scaling afresh)";
  QR_CHECK(std::isfinite(values.scale) && values.scale > 0.0f, who, ": scale is ",
           float_str(values.scale), "; a scale is a finite number > 0", corrupt);
  const float reciprocal = 1.0f / values.scale;
  QR_CHECK(values.scale_inv == reciprocal, who, ": scale_inv is ", float_str(values.scale_inv),
           " but 1/scale is ", float_str(reciprocal), " (scale_inv is always the float "
           "reciprocal of scale)", corrupt);
  for (std::size_t i = 0; i < n; ++i) {
    const float a = values.amax_history[i];
    QR_CHECK(!std::isnan(a) && a >= 0.0f, who, ": amax_history[", i, "] is ", float_str(a),
             "; an amax is >= 0 and not NaN", corrupt);
  }
}

void Engine::set_scaling_values(std::size_t index, const ScalingValues& values) {
  check_scaling_values(index, values);
  ScalingState& s = *states_[index];
  write_values(s, values);
  // The other members of a shared state take the same history and scale, and a row 0 of 0, so
  // the group's row 0 (their max) is the loaded one whichever members are loaded.
  ScalingValues others = values;
  others.amax_history[0] = 0.0f;
  for (std::size_t member : group_of(index))
    if (member != index) write_values(*states_[member], others);
}

void Engine::update_scaling() { update_scaling_on_streams({}); }

void Engine::update_scaling_on_streams(const StreamFor& stream_for) {
  std::vector<std::size_t> all(states_.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  update_states(all, {}, stream_for);
}

void Engine::update_scaling(const std::vector<float>& reduced_amaxes) {
  QR_CHECK(reduced_amaxes.size() == states_.size(), "update_scaling got ", reduced_amaxes.size(),
           " amaxes for ", states_.size(), " scaling states; pass current_amaxes() after reducing it");
  std::vector<std::size_t> all(states_.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  update_states(all, reduced_amaxes, {});
}

void Engine::update_scaling_of(const std::vector<std::size_t>& indices) {
  for (std::size_t i : indices)
    QR_CHECK(i < states_.size(), "scaling state ", i, " does not exist; this engine has ",
             states_.size());
  update_states(with_groups(indices), {}, {});  // a shared state updates as one
}

void Engine::update_states(const std::vector<std::size_t>& indices,
                           const std::vector<float>& reduced_amaxes, const StreamFor& stream_for) {
  // CPU states update in place; CUDA states are grouped by device and each group is updated
  // by one kernel launch (the same delayed_scaling_update, on the device).
  //
  // A shared state (share groups, acquire_scaling_state) updates as one: every member with the
  // group's amax, the max over its members' row 0 (or their reduced amaxes), so all members
  // keep the same history and scale. A group whose members all live on one CUDA device is
  // reduced on that device, before the update (no host synchronization); a group with CPU
  // members or members on several devices is reduced through the host.
  std::vector<float> amaxes(indices.size(), 0.0f);
  std::vector<char> explicit_amax(indices.size(), reduced_amaxes.empty() ? 0 : 1);
  if (!reduced_amaxes.empty()) amaxes = reduced_amaxes;
  std::map<int, std::vector<std::vector<float*>>> device_groups;  // device -> member row 0s
  {
    std::map<std::string, std::vector<std::size_t>> present;  // share name -> positions k
    for (std::size_t k = 0; k < indices.size(); ++k)
      if (auto it = group_name_.find(indices[k]); it != group_name_.end())
        present[it->second].push_back(k);
    for (const auto& [name, positions] : present) {
      if (positions.size() < 2) continue;
      const Device first = Device::from_c(states_[indices[positions.front()]]->c.device);
      const bool on_one_device =
          first.is_cuda() && reduced_amaxes.empty() &&
          std::all_of(positions.begin(), positions.end(), [&](std::size_t k) {
            return Device::from_c(states_[indices[k]]->c.device) == first;
          });
      if (on_one_device) {
        auto& rows = device_groups[first.index].emplace_back();
        for (std::size_t k : positions) rows.push_back(states_[indices[k]]->c.amax_history);
        continue;
      }
      float group = 0.0f;
      for (std::size_t k : positions)
        group = std::fmax(group, reduced_amaxes.empty() ? row0_of(*states_[indices[k]])
                                                        : reduced_amaxes[k]);
      for (std::size_t k : positions) {
        amaxes[k] = group;
        explicit_amax[k] = 1;
      }
    }
  }
  std::map<int, std::vector<detail::DeviceScalingUpdate>> on_device;
  for (std::size_t k = 0; k < indices.size(); ++k) {
    auto& s = *states_[indices[k]];
    if (s.c.device.type == QR_DEVICE_CPU) {
      const float amax = explicit_amax[k] ? amaxes[k] : s.c.amax_history[0];
      delayed_scaling_update(s.c.amax_history, s.c.history_len, s.c.scale, s.c.scale_inv, amax,
                             s.request.algo_most_recent != 0, s.request.margin,
                             s.request.fp8_max);
      continue;
    }
    on_device[s.c.device.index].push_back(
        {s.c.amax_history, s.c.scale, s.c.scale_inv, s.c.history_len,
         s.request.algo_most_recent, s.request.margin, s.request.fp8_max,
         explicit_amax[k] ? amaxes[k] : 0.0f, explicit_amax[k] ? 0 : 1});
  }
  // The device copy of a table is reused while the states stay put and the whole set updates
  // with its own row 0 (every training step); anything else uploads a fresh table. A share group
  // reduced through the host (CPU members, or members on several devices) writes this step's
  // group amax into its CUDA members' entries, so such a table is fresh every step too.
  const bool host_reduced_group = std::any_of(explicit_amax.begin(), explicit_amax.end(),
                                              [](char e) { return e != 0; });
  const bool reusable =
      reduced_amaxes.empty() && !host_reduced_group && indices.size() == states_.size();
  for (const auto& [device, updates] : on_device) {
#if defined(QRECIPE_WITH_CUDA)
    auto& table = device_tables_[device];
    if (!table) table = std::make_shared<detail::DeviceScalingTable>(device);
    void* stream = stream_for ? stream_for(device) : nullptr;
    table->run(updates, device_groups[device], reusable ? states_version_ : 0, stream);
#else
    (void)reusable, (void)stream_for;  // used by the CUDA build only
    QR_THROW_CODE(QR_STATUS_UNSUPPORTED, updates.size(), " delayed-scaling state(s) on cuda:",
                  device, " but this build of libqrecipe has no CUDA");
#endif
  }
}

}  // namespace qrecipe
